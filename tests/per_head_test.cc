// The additive view's promises, on every compiled target: the per-head
// contributions plus gates and bias add up to y; a gate of 0 is the same as
// removing the head; fractional gates scale a head; per_head alone (y NULL)
// works; attribution is per_head dotted with the directions; the norms are
// the per_head norms.  Library outputs are compared with each other (and with
// the reference), with bounds that add the bounds of each side.
#include <cmath>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::SeedShape;

std::vector<MhaShape> PerHeadShapes() {
  return {SeedShape(),
          MhaShape{2, 8, 8, 17, 17, 7, 17, false},
          MhaShape{1, 2, 2, 65, 65, 80, 96, false},
          MhaShape{2, 1, 1, 3, 3, 128, 1, false}};
}

struct ProjInputs {
  ProjInputs(const MhaShape& s, uint64_t seed)
      : heads(RandomUniform(s.out_elems(), -1.0f, 1.0f, 8 * seed + 1)),
        wo(RandomUniform(s.wo_elems(), -1.0f, 1.0f, 8 * seed + 2)),
        bias(RandomUniform(size_t(s.model_dim), -1.0f, 1.0f, 8 * seed + 3)) {}
  std::vector<float> heads, wo, bias;
};

testing::AssertionResult CallFailed(const char* fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

// Calls project_heads_sum_ex with both outputs; empty vectors on failure.
struct ExResult {
  headsum_status status;
  std::vector<float> y, per_head;
};
ExResult RunEx(const MhaShape& s, const ProjInputs& in, const float* gates, bool want_y,
               bool want_per_head) {
  const headsum_proj_shape shape = s.proj();
  ExResult r{HEADSUM_OK, Sentinels(s.y_elems()), Sentinels(s.per_head_elems())};
  r.status = headsum_project_heads_sum_ex(&shape, in.heads.data(), in.wo.data(), in.bias.data(),
                                          gates, want_y ? r.y.data() : nullptr,
                                          want_per_head ? r.per_head.data() : nullptr);
  return r;
}

// sum_h |g_h| * per-head bound, per y element: how far sum_h g_h per_head~
// may be from the exact sum given each per_head~ is within its bound.
std::vector<double> GatedContributionBound(const RefProjDims& d,
                                           const std::vector<double>& contribution_bound,
                                           const std::vector<float>& gates) {
  std::vector<double> out(d.y_elems(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t col = 0; col < d.model_dim; ++col) {
          out[size_t((b * d.seq + s) * d.model_dim + col)] +=
              std::fabs(gates[size_t(h)]) *
              contribution_bound[d.bsh(b, s, h) * size_t(d.model_dim) + size_t(col)];
        }
      }
    }
  }
  return out;
}

std::vector<double> Widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

class PerHead : public TargetTest {};

// y == sum_h g_h per_head[h] + bias, with both taken from one call.
TEST_P(PerHead, ContributionsTimesGatesPlusBiasAddUpToY) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, n);
    const auto gates = RandomUniform(size_t(s.heads), -1.5f, 1.5f, 50 + n);
    const ExResult r = RunEx(s, in, gates.data(), true, true);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
    const RefProjDims d(s.proj());
    const auto abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> summed =
        RefGatedSum(d, Widen(r.per_head), gates.data(), in.bias.data());
    std::vector<double> bound = ProjectionBound(d, abs_c, gates.data(), in.bias.data());
    const auto from_per_head = GatedContributionBound(d, ContributionBound(d, abs_c), gates);
    for (size_t i = 0; i < bound.size(); ++i) bound[i] += from_per_head[i];
    return AllWithinBound(summed, bound, r.y, YLayout(s));
  });
}

// Removing head k from the model (its O slice and its rows of Wo).
struct WithoutHead {
  MhaShape shape;
  std::vector<float> heads, wo;
};
WithoutHead RemoveHead(const MhaShape& s, const ProjInputs& in, int64_t k) {
  WithoutHead w{s, {}, {}};
  w.shape.heads = s.heads - 1;
  w.shape.kv_heads = w.shape.heads;
  const size_t o_block = size_t(s.seq_q * s.head_dim);      // one head's O in one batch
  const size_t wo_block = size_t(s.head_dim * s.model_dim);  // one head's Wo rows
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      if (h == k) continue;
      const auto* src = &in.heads[size_t(b * s.heads + h) * o_block];
      w.heads.insert(w.heads.end(), src, src + o_block);
    }
  }
  for (int64_t h = 0; h < s.heads; ++h) {
    if (h == k) continue;
    w.wo.insert(w.wo.end(), &in.wo[size_t(h) * wo_block], &in.wo[size_t(h) * wo_block] + wo_block);
  }
  return w;
}

// g_k = 0 (others 1): y equals the reference of the model without head k;
// per_head[k] still holds head k's ungated contribution.
TEST_P(PerHead, ZeroGateEqualsRemovingTheHead) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    if (s.heads < 2) return testing::AssertionSuccess();  // nothing would be left
    const ProjInputs in(s, 100 + n);
    const RefProjDims d(s.proj());
    const auto c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const auto c_bound = ContributionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()));
    for (int64_t k = 0; k < s.heads; ++k) {
      std::vector<float> gates(size_t(s.heads), 1.0f);
      gates[size_t(k)] = 0.0f;
      for (const bool with_per_head : {false, true}) {
        const ExResult r = RunEx(s, in, gates.data(), true, with_per_head);
        if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
        const WithoutHead w = RemoveHead(s, in, k);
        const RefProjDims dw(w.shape.proj());
        auto res = AllWithinBound(
            RefConcatProject(dw, w.heads.data(), w.wo.data(), in.bias.data()),
            ProjectionBound(dw, AbsContributions(dw, w.heads.data(), w.wo.data()), nullptr,
                            in.bias.data()),
            r.y, YLayout(s));
        if (!res) {
          return res << " (gate of head " << k << " = 0, per_head "
                     << (with_per_head ? "requested" : "NULL") << ")";
        }
        if (with_per_head) {
          res = AllWithinBound(c, c_bound, r.per_head, PerHeadLayout(s, s.model_dim, 'd'));
          if (!res) return res << " (per_head must stay ungated; head " << k << " gated to 0)";
        }
      }
    }
    return testing::AssertionSuccess();
  });
}

// Gates 0.5, -0.25, 2, 0.1, ... scale each head's share of y.
TEST_P(PerHead, FractionalGatesScaleEachHead) {
  const float pattern[] = {0.5f, -0.25f, 2.0f, 0.1f, 1.0f, -1.0f, 0.75f, 0.0f};
  ForEachShape(PerHeadShapes(), [&](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, 200 + n);
    std::vector<float> gates(size_t(s.heads));
    for (size_t h = 0; h < gates.size(); ++h) gates[h] = pattern[h % 8];
    const ExResult r = RunEx(s, in, gates.data(), true, false);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
    const RefProjDims d(s.proj());
    return AllWithinBound(
        RefGatedSum(d, RefHeadContributions(d, in.heads.data(), in.wo.data()), gates.data(),
                    in.bias.data()),
        ProjectionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()), gates.data(),
                        in.bias.data()),
        r.y, YLayout(s));
  });
}

// y = NULL with per_head only is valid and gives the contributions.
TEST_P(PerHead, PerHeadOnlyWithNullYWorks) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, 300 + n);
    const ExResult r = RunEx(s, in, nullptr, false, true);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex(y = NULL)", r.status);
    const RefProjDims d(s.proj());
    return AllWithinBound(RefHeadContributions(d, in.heads.data(), in.wo.data()),
                          ContributionBound(d, AbsContributions(d, in.heads.data(), in.wo.data())),
                          r.per_head, PerHeadLayout(s, s.model_dim, 'd'));
  });
}

// Gates NULL and per_head NULL: the same sum as project_heads_sum.
TEST_P(PerHead, NullGatesAndNullPerHeadEqualsProjectHeadsSum) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, 400 + n);
    const ExResult r = RunEx(s, in, nullptr, true, false);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
    const headsum_proj_shape shape = s.proj();
    std::vector<float> y = Sentinels(s.y_elems());
    const headsum_status st = headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(),
                                                        in.bias.data(), y.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
    const RefProjDims d(shape);
    std::vector<double> bound = ProjectionBound(
        d, AbsContributions(d, in.heads.data(), in.wo.data()), nullptr, in.bias.data());
    for (double& b : bound) b *= 2;
    return AllWithinBound(Widen(y), bound, r.y, YLayout(s));
  });
}

// attribution[b][s][h][r] == per_head[b][s][h][:] . directions[r], R = 1 and 3.
TEST_P(PerHead, AttributionEqualsPerHeadDottedWithDirections) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, 500 + n);
    const ExResult r = RunEx(s, in, nullptr, false, true);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
    const headsum_proj_shape shape = s.proj();
    const RefProjDims d(shape);
    const auto c_bound = ContributionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()));
    for (const int64_t R : {int64_t{1}, int64_t{3}}) {
      const auto dirs = RandomUniform(size_t(R * s.model_dim), -1.0f, 1.0f, 600 + n + R);
      std::vector<float> out = Sentinels(size_t(s.batch * s.seq_q * s.heads * R));
      const headsum_status st = headsum_head_attribution(&shape, in.heads.data(), in.wo.data(),
                                                         dirs.data(), R, out.data());
      if (st != HEADSUM_OK) return CallFailed("head_attribution", st);
      // |attribution~ - per_head~ . dir| <= attribution bound + sum_col |dir_col| per_head bound
      std::vector<double> bound =
          AttributionBound(d, in.heads.data(), in.wo.data(), dirs.data(), R);
      std::vector<float> abs_dirs = dirs;
      for (float& x : abs_dirs) x = std::fabs(x);
      const auto from_per_head = RefAttribution(d, c_bound, abs_dirs.data(), R);
      for (size_t i = 0; i < bound.size(); ++i) bound[i] += from_per_head[i];
      const auto res = AllWithinBound(RefAttribution(d, Widen(r.per_head), dirs.data(), R), bound,
                                      out, PerHeadLayout(s, R, 'r'));
      if (!res) return testing::AssertionFailure() << res.message() << " (R = " << R << ")";
    }
    return testing::AssertionSuccess();
  });
}

// norms[b][s][h] == || per_head[b][s][h][:] ||.
TEST_P(PerHead, NormsEqualNormsOfPerHead) {
  ForEachShape(PerHeadShapes(), [](const MhaShape& s, uint64_t n) {
    const ProjInputs in(s, 700 + n);
    const ExResult r = RunEx(s, in, nullptr, false, true);
    if (r.status != HEADSUM_OK) return CallFailed("project_heads_sum_ex", r.status);
    const headsum_proj_shape shape = s.proj();
    std::vector<float> norms = Sentinels(size_t(s.batch * s.seq_q * s.heads));
    const headsum_status st =
        headsum_head_contribution_norms(&shape, in.heads.data(), in.wo.data(), norms.data());
    if (st != HEADSUM_OK) return CallFailed("head_contribution_norms", st);
    const RefProjDims d(shape);
    const auto c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const auto abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    // | ||per_head~|| - ||c|| | <= || per_head bound || (triangle inequality)
    std::vector<double> bound = ContributionNormsBound(d, c, abs_c);
    const auto per_head_bound_norm = RefContributionNorms(d, ContributionBound(d, abs_c));
    for (size_t i = 0; i < bound.size(); ++i) bound[i] += per_head_bound_norm[i];
    return AllWithinBound(RefContributionNorms(d, Widen(r.per_head)), bound, norms,
                          PerHeadLayout(s, 1, '-'));
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(PerHead);

}  // namespace
}  // namespace headsum_test
