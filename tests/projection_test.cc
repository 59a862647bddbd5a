// The output projection family on every compiled target, over the
// projection sweep, against the textbook reference (concat the heads, one
// GEMM with Wo, + bias) and the per-head contributions c_h = O_h Wo[h]:
// project_heads_sum, project_heads_sum_ex, head_attribution,
// head_contribution_norms; and the seed's equivalence
// project_heads_sum == concat_project_onednn == reference.
#include <vector>

#include "../dispatch/test_hooks.h"  // the cache sizes the projection blocks for
#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::ProjectionSweepShapes;
using headsum_shapes::SmallSweepShapes;

// Inputs of one projection: O [B][H][S][L], Wo [H*L][D], bias [D], gates [H].
struct ProjInputs {
  ProjInputs(const MhaShape& s, uint64_t seed)
      : heads(RandomUniform(s.out_elems(), -1.0f, 1.0f, 8 * seed + 1)),
        wo(RandomUniform(s.wo_elems(), -1.0f, 1.0f, 8 * seed + 2)),
        bias(RandomUniform(size_t(s.model_dim), -1.0f, 1.0f, 8 * seed + 3)),
        gates(RandomUniform(size_t(s.heads), -1.5f, 1.5f, 8 * seed + 4)) {}
  std::vector<float> heads, wo, bias, gates;
};

testing::AssertionResult CallFailed(const char* fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

// Odd-numbered shapes pass bias = NULL (valid: no bias).
const float* MaybeBias(const ProjInputs& in, uint64_t n) {
  return n % 2 == 1 ? nullptr : in.bias.data();
}

// ---- project_heads_sum -----------------------------------------------------------

class ProjectHeadsSum : public TargetTest {};

TEST_P(ProjectHeadsSum, EqualsConcatThenGemmReference) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, n);
    const float* bias = MaybeBias(in, n);
    std::vector<float> y = Sentinels(s.y_elems());
    const headsum_status st =
        headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), bias, y.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
    const RefProjDims d(shape);
    return AllWithinBound(RefConcatProject(d, in.heads.data(), in.wo.data(), bias),
                          ProjectionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()),
                                          nullptr, bias),
                          y, YLayout(s));
  });
}

// The seed's claim: the additive form, oneDNN's concat-then-GEMM and the
// double reference agree (each within the bound of the exact result, so the
// two f32 results within twice the bound of each other).
TEST_P(ProjectHeadsSum, EqualsConcatProjectOnednnAndReference) {
  {
    const headsum_proj_shape shape = MhaShape{1, 1, 1, 1, 1, 1, 1, false}.proj();
    const float one = 1;
    float y = 0;
    if (headsum_concat_project_onednn(&shape, &one, &one, nullptr, &y) ==
        HEADSUM_ERR_UNSUPPORTED) {
      GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
    }
  }
  std::vector<MhaShape> shapes;
  for (const MhaShape& s : SmallSweepShapes()) {
    if (!s.causal) shapes.push_back(s);
  }
  ForEachShape(shapes, [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 100 + n);
    const float* bias = MaybeBias(in, n);
    std::vector<float> y_sum = Sentinels(s.y_elems()), y_onednn = Sentinels(s.y_elems());
    headsum_status st =
        headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), bias, y_sum.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
    st = headsum_concat_project_onednn(&shape, in.heads.data(), in.wo.data(), bias,
                                       y_onednn.data());
    if (st != HEADSUM_OK) return CallFailed("concat_project_onednn", st);
    const RefProjDims d(shape);
    const std::vector<double> ref = RefConcatProject(d, in.heads.data(), in.wo.data(), bias);
    std::vector<double> bound = ProjectionBound(
        d, AbsContributions(d, in.heads.data(), in.wo.data()), nullptr, bias);
    auto r = AllWithinBound(ref, bound, y_sum, YLayout(s));
    if (!r) return r << " (project_heads_sum vs reference)";
    r = AllWithinBound(ref, bound, y_onednn, YLayout(s));
    if (!r) return r << " (concat_project_onednn vs reference)";
    for (double& b : bound) b *= 2;
    r = AllWithinBound(std::vector<double>(y_onednn.begin(), y_onednn.end()), bound, y_sum,
                       YLayout(s));
    if (!r) return r << " (project_heads_sum vs concat_project_onednn)";
    return r;
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(ProjectHeadsSum);

// ---- headsum_wo_pack + project_heads_sum_packed -----------------------------------

class ProjectHeadsSumPacked : public TargetTest {};

// Packed Wo gives the reference within the bound, and bitwise the result of
// the plain call on the same target (the same FMA chains, read from panels).
TEST_P(ProjectHeadsSumPacked, EqualsReferenceAndPlainCallBitwise) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 500 + n);
    const float* bias = MaybeBias(in, n);
    headsum_wo_packed* packed = nullptr;
    headsum_status st = headsum_wo_pack(&shape, in.wo.data(), &packed);
    if (st != HEADSUM_OK) return CallFailed("wo_pack", st);
    std::vector<float> y = Sentinels(s.y_elems()), y_plain = Sentinels(s.y_elems());
    st = headsum_project_heads_sum_packed(&shape, in.heads.data(), packed, bias, y.data());
    headsum_wo_free(packed);
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum_packed", st);
    st = headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), bias, y_plain.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
    const RefProjDims d(shape);
    auto r = AllWithinBound(RefConcatProject(d, in.heads.data(), in.wo.data(), bias),
                            ProjectionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()),
                                            nullptr, bias),
                            y, YLayout(s));
    if (!r) return r << " (packed vs reference)";
    r = BitwiseEqual(y_plain, y, YLayout(s));
    if (!r) return r << " (packed vs plain call)";
    return r;
  });
}

// From kCopyWoRows rows on, the chained sum packs O in blocks of rows sized
// to the L2 and runs each Wo panel over them in blocks of K sized to the
// L1, the sizes it reads from sysconf; below, it reads O in place.
// Whichever, each element of Y is the same FMA chain.  With the blocked
// path taken from three rows on, caches of one byte (the fewest rows a
// block, 48, and 8 rows of K a block: partial sums carried across many
// blocks) and of a gigabyte (the largest blocks, K in one block) give the
// plain and the packed call's bits of the default (for most of these
// shapes O in place).
TEST_P(ProjectHeadsSumPacked, AnyBlockingGivesTheSameBits) {
  struct RestoreSizes {
    ~RestoreSizes() {
      headsum::testing::SetProjectionCacheBytes(0, 0);
      headsum::testing::SetProjectionPackedFromRows(0);
    }
  } restore;
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 900 + n);
    const float* bias = MaybeBias(in, n);
    headsum_wo_packed* packed = nullptr;
    headsum_status st = headsum_wo_pack(&shape, in.wo.data(), &packed);
    if (st != HEADSUM_OK) return CallFailed("wo_pack", st);
    std::vector<std::vector<float>> ys;
    for (const size_t bytes : {size_t{0}, size_t{1}, size_t{1} << 30, size_t{0}}) {
      headsum::testing::SetProjectionCacheBytes(bytes, bytes);
      headsum::testing::SetProjectionPackedFromRows(ys.empty() ? 0 : 3);
      ys.push_back(Sentinels(s.y_elems()));
      st = headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), bias, ys.back().data());
      if (st != HEADSUM_OK) break;
      ys.push_back(Sentinels(s.y_elems()));
      st = headsum_project_heads_sum_packed(&shape, in.heads.data(), packed, bias,
                                            ys.back().data());
      if (st != HEADSUM_OK) break;
    }
    headsum::testing::SetProjectionCacheBytes(0, 0);
    headsum::testing::SetProjectionPackedFromRows(0);
    headsum_wo_free(packed);
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum(_packed)", st);
    const RefProjDims d(shape);
    auto r = AllWithinBound(RefConcatProject(d, in.heads.data(), in.wo.data(), bias),
                            ProjectionBound(d, AbsContributions(d, in.heads.data(), in.wo.data()),
                                            nullptr, bias),
                            ys[2], YLayout(s));
    if (!r) return r << " (one-byte caches vs reference)";
    for (size_t i = 1; i < ys.size(); ++i) {
      r = BitwiseEqual(ys[0], ys[i], YLayout(s));
      if (!r) {
        return r << " (call " << i << " of plain/packed x default, then blocked from 3 rows"
                 << " with 1 B / 1 GiB / sysconf caches)";
      }
    }
    return r;
  });
}

// The packed layout does not depend on the target: Wo packed on the best
// target (and on SCALAR) serves this target, for many calls and batch sizes.
TEST_P(ProjectHeadsSumPacked, HandleOfAnyTargetServesThisTarget) {
  const MhaShape base{1, 8, 8, 20, 20, 64, 512, false};
  const ProjInputs in(MhaShape{3, 8, 8, 65, 65, 64, 512, false}, 77);
  for (const char* packer : {static_cast<const char*>(nullptr), "SCALAR"}) {
    const headsum_status set = headsum_set_target(packer);
    if (set == HEADSUM_ERR_UNSUPPORTED) continue;  // a build without SCALAR
    ASSERT_EQ(set, HEADSUM_OK) << headsum_last_error();
    headsum_wo_packed* packed = nullptr;
    const headsum_proj_shape pack_shape = base.proj();
    const headsum_status st = headsum_wo_pack(&pack_shape, in.wo.data(), &packed);
    ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
    ASSERT_EQ(headsum_set_target(GetParam().c_str()), HEADSUM_OK);
    for (const MhaShape& s : {MhaShape{1, 8, 8, 1, 1, 64, 512, false},
                              MhaShape{1, 8, 8, 20, 20, 64, 512, false},
                              MhaShape{3, 8, 8, 65, 65, 64, 512, false}}) {
      const headsum_proj_shape shape = s.proj();
      std::vector<float> y = Sentinels(s.y_elems()), y_plain = Sentinels(s.y_elems());
      ASSERT_EQ(headsum_project_heads_sum_packed(&shape, in.heads.data(), packed,
                                                 in.bias.data(), y.data()),
                HEADSUM_OK)
          << headsum_last_error();
      ASSERT_EQ(headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), in.bias.data(),
                                          y_plain.data()),
                HEADSUM_OK)
          << headsum_last_error();
      EXPECT_TRUE(BitwiseEqual(y_plain, y, YLayout(s)))
          << s.name() << ", packed on " << (packer ? packer : "the best target");
    }
    headsum_wo_free(packed);
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(ProjectHeadsSumPacked);

// ---- project_heads_sum_ex ----------------------------------------------------------

class ProjectHeadsSumEx : public TargetTest {};

// y = sum_h g_h c_h + bias and per_head = c_h (ungated, no bias), with
// random gates in [-1.5, 1.5] (every third shape: gates NULL = all 1).
TEST_P(ProjectHeadsSumEx, EqualsGatedSumOfHeadContributions) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 200 + n);
    const float* bias = MaybeBias(in, n);
    const float* gates = n % 3 == 0 ? nullptr : in.gates.data();
    std::vector<float> y = Sentinels(s.y_elems()), per_head = Sentinels(s.per_head_elems());
    const headsum_status st = headsum_project_heads_sum_ex(
        &shape, in.heads.data(), in.wo.data(), bias, gates, y.data(), per_head.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex", st);
    const RefProjDims d(shape);
    const auto c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const auto abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    auto r = AllWithinBound(RefGatedSum(d, c, gates, bias),
                            ProjectionBound(d, abs_c, gates, bias), y, YLayout(s));
    if (!r) return r << " (y)";
    r = AllWithinBound(c, ContributionBound(d, abs_c), per_head,
                       PerHeadLayout(s, s.model_dim, 'd'));
    if (!r) return r << " (per_head)";
    return r;
  });
}

// With every gate 1 and y only, _ex is project_heads_sum, bitwise: the gates
// do not change the arithmetic of the plain sum.
TEST_P(ProjectHeadsSumEx, UnitGatesGiveThePlainSumBitwise) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 600 + n);
    const float* bias = MaybeBias(in, n);
    const std::vector<float> ones(size_t(s.heads), 1.0f);
    std::vector<float> y = Sentinels(s.y_elems()), y_plain = Sentinels(s.y_elems());
    headsum_status st = headsum_project_heads_sum_ex(&shape, in.heads.data(), in.wo.data(), bias,
                                                     ones.data(), y.data(), nullptr);
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex", st);
    st = headsum_project_heads_sum(&shape, in.heads.data(), in.wo.data(), bias, y_plain.data());
    if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
    return BitwiseEqual(y_plain, y, YLayout(s));
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(ProjectHeadsSumEx);

// ---- head_attribution ----------------------------------------------------------------

class HeadAttribution : public TargetTest {};

// out[b][s][h][r] = c_h . directions[r], with R = 1 and R = 3 alternating.
TEST_P(HeadAttribution, EqualsContributionsDottedWithDirections) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const int64_t R = n % 2 == 0 ? 1 : 3;
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 300 + n);
    const auto dirs = RandomUniform(size_t(R * s.model_dim), -1.0f, 1.0f, 8 * (300 + n) + 5);
    std::vector<float> out = Sentinels(size_t(s.batch * s.seq_q * s.heads * R));
    const headsum_status st = headsum_head_attribution(&shape, in.heads.data(), in.wo.data(),
                                                       dirs.data(), R, out.data());
    if (st != HEADSUM_OK) return CallFailed("head_attribution", st);
    const RefProjDims d(shape);
    const auto c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    return AllWithinBound(RefAttribution(d, c, dirs.data(), R),
                          AttributionBound(d, in.heads.data(), in.wo.data(), dirs.data(), R), out,
                          PerHeadLayout(s, R, 'r'));
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(HeadAttribution);

// ---- head_contribution_norms -------------------------------------------------------

class HeadContributionNorms : public TargetTest {};

TEST_P(HeadContributionNorms, EqualsNormsOfHeadContributions) {
  ForEachShape(ProjectionSweepShapes(), [](const MhaShape& s, uint64_t n) {
    const headsum_proj_shape shape = s.proj();
    const ProjInputs in(s, 400 + n);
    std::vector<float> out = Sentinels(size_t(s.batch * s.seq_q * s.heads));
    const headsum_status st =
        headsum_head_contribution_norms(&shape, in.heads.data(), in.wo.data(), out.data());
    if (st != HEADSUM_OK) return CallFailed("head_contribution_norms", st);
    const RefProjDims d(shape);
    const auto c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const auto abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    return AllWithinBound(RefContributionNorms(d, c), ContributionNormsBound(d, c, abs_c), out,
                          PerHeadLayout(s, 1, '-'));
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(HeadContributionNorms);

}  // namespace
}  // namespace headsum_test
