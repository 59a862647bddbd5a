// Out-of-bounds accesses, caught by the MMU: every input and output buffer of
// every kernel is placed flush against a PROT_NONE page, once with the page
// right after the buffer's last element and once with the page right before
// its first, and inputs are read-only.  A kernel that reads or writes one
// element (or one vector lane) past either end of any buffer, or writes an
// input, dies with SIGSEGV.  Runs every kernel on every compiled target over
// the shape sweep of shapes.h (sizes just off vector and tile edges) plus a
// few shapes that reach the tiling paths the sweep does not (key splits for
// decode, more than one qk_scores row block).  Every output element must be
// written, and one shape in 16 is also checked against the reference, so the
// test fails for wrong results as well as for crashes.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::SweepShapes;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Which end of the buffer touches the PROT_NONE page.
enum class Guard { kAfterLast, kBeforeFirst };

const char* GuardName(Guard g) {
  return g == Guard::kAfterLast ? "PROT_NONE page right after the last element"
                                : "PROT_NONE page right before the first element";
}

size_t PageSize() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

// n floats in their own mapping, flush against a PROT_NONE page.  With
// kAfterLast the buffer ends where the guard page begins (so it starts at
// whatever 4-byte alignment n gives it); with kBeforeFirst it starts where
// the guard page ends (page-aligned).
class GuardedBuffer {
 public:
  GuardedBuffer(size_t n, Guard guard) : n_(n) {
    const size_t page = PageSize();
    const size_t bytes = n * sizeof(float);
    data_pages_ = (bytes + page - 1) / page;
    if (data_pages_ == 0) data_pages_ = 1;
    map_bytes_ = (data_pages_ + 1) * page;
    void* map = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (map == MAP_FAILED) {
      perror("mmap");
      std::abort();
    }
    map_ = static_cast<char*>(map);
    if (guard == Guard::kAfterLast) {
      data_region_ = map_;
      guard_page_ = map_ + data_pages_ * page;
      data_ = reinterpret_cast<float*>(guard_page_ - bytes);
    } else {
      guard_page_ = map_;
      data_region_ = map_ + page;
      data_ = reinterpret_cast<float*>(data_region_);
    }
    if (mprotect(guard_page_, page, PROT_NONE) != 0) {
      perror("mprotect");
      std::abort();
    }
  }
  GuardedBuffer(const std::vector<float>& values, Guard guard)
      : GuardedBuffer(values.size(), guard) {
    std::memcpy(data_, values.data(), values.size() * sizeof(float));
  }
  ~GuardedBuffer() { munmap(map_, map_bytes_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return n_; }
  std::vector<float> ToVector() const { return std::vector<float>(data_, data_ + n_); }

  // Inputs: a write to them faults too.
  void MakeReadOnly() {
    if (mprotect(data_region_, data_pages_ * PageSize(), PROT_READ) != 0) {
      perror("mprotect");
      std::abort();
    }
  }

 private:
  size_t n_;
  size_t data_pages_ = 0, map_bytes_ = 0;
  char* map_ = nullptr;
  char* data_region_ = nullptr;
  char* guard_page_ = nullptr;
  float* data_ = nullptr;
};

std::unique_ptr<GuardedBuffer> Input(const std::vector<float>& values, Guard guard) {
  auto b = std::make_unique<GuardedBuffer>(values, guard);
  b->MakeReadOnly();
  return b;
}
std::unique_ptr<GuardedBuffer> Output(size_t n, Guard guard) {
  return std::make_unique<GuardedBuffer>(Sentinels(n), guard);
}

// Shapes the sweep does not reach: decode with >= 1024 keys (attention splits
// the keys in 512s and merges partials), > 256 query rows (several qk_scores
// row blocks), > 48 rows and > 128 columns of Y with ragged ends.
std::vector<MhaShape> ExtraTilingShapes() {
  return {
      MhaShape{1, 2, 1, 1, 1024, 64, 17, false},
      MhaShape{2, 3, 1, 3, 1537, 7, 130, true},
      MhaShape{1, 2, 2, 48, 1025, 16, 96, true},
      MhaShape{1, 1, 0, 49, 2049, 5, 3, false},
      MhaShape{1, 2, 1, 257, 5, 17, 129, false},
      MhaShape{1, 1, 1, 263, 263, 9, 257, true},
  };
}

std::vector<MhaShape> GuardShapes() {
  std::vector<MhaShape> shapes = SweepShapes();
  for (const MhaShape& s : ExtraTilingShapes()) shapes.push_back(s);
  return shapes;
}

// Numbers of directions: 1, and counts off vector edges.
int64_t DirectionsFor(uint64_t n) {
  static const int64_t r[] = {1, 3, 17, 2};
  return r[n % 4];
}

testing::AssertionResult CallFailed(const std::string& fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

testing::AssertionResult AllWritten(const std::string& fn, const GuardedBuffer& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.data()[i] == kSentinel) {
      return testing::AssertionFailure() << fn << " left element " << i << " of "
                                         << out.size() << " unwritten";
    }
  }
  return testing::AssertionSuccess();
}

testing::AssertionResult Within(const std::string& fn, const std::vector<double>& expected,
                                const std::vector<double>& bound, const GuardedBuffer& out,
                                const Layout& layout) {
  testing::AssertionResult r = AllWithinBound(expected, bound, out.ToVector(), layout);
  if (!r) return testing::AssertionFailure() << fn << " vs reference: " << r.message();
  return r;
}

// Scores for softmax_v: random, -inf where the causal mask hides the entry
// (as qk_scores writes them), and a few -inf of the caller's own.
std::vector<float> SoftmaxScores(const MhaShape& s, uint64_t seed) {
  std::vector<float> scores = RandomUniform(s.scores_elems(), -4.0f, 4.0f, seed);
  const auto coin = RandomUniform(scores.size(), 0.0f, 1.0f, seed + 1);
  size_t e = 0;
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      for (int64_t j = 0; j < s.seq_kv; ++j, ++e) {
        const bool masked = s.causal && j > i + (s.seq_kv - s.seq_q);
        if (masked || coin[e] < 0.1f) scores[e] = -kInf;
      }
    }
  }
  return scores;
}

// Runs every kernel with every buffer guarded on `guard`'s side.
testing::AssertionResult RunAllKernelsGuarded(const MhaShape& s, uint64_t n, Guard guard,
                                              bool check_reference) {
  const headsum_attn_shape a = s.attn(n % 3 == 2 ? 0.37f : 0.0f);
  const headsum_proj_shape p = s.proj();
  const int64_t R = DirectionsFor(n);
  const size_t rows = size_t(s.batch * s.seq_q * s.heads);

  const std::vector<float> q_v = RandomUniform(s.q_elems(), -1, 1, 32 * n + 1);
  const std::vector<float> k_v = RandomUniform(s.kv_elems(), -1, 1, 32 * n + 2);
  const std::vector<float> v_v = RandomUniform(s.kv_elems(), -1, 1, 32 * n + 3);
  const std::vector<float> scores_v = SoftmaxScores(s, 32 * n + 4);
  const std::vector<float> heads_v = RandomUniform(s.out_elems(), -1, 1, 32 * n + 6);
  const std::vector<float> wo_v = RandomUniform(s.wo_elems(), -1, 1, 32 * n + 7);
  const std::vector<float> bias_v = RandomUniform(size_t(s.model_dim), -1, 1, 32 * n + 8);
  const std::vector<float> gates_v = RandomUniform(size_t(s.heads), -1.5f, 1.5f, 32 * n + 9);
  const std::vector<float> dirs_v = RandomUniform(size_t(R * s.model_dim), -1, 1, 32 * n + 10);

  auto q = Input(q_v, guard), k = Input(k_v, guard), v = Input(v_v, guard);
  auto scores_in = Input(scores_v, guard);
  auto heads = Input(heads_v, guard), wo = Input(wo_v, guard), bias = Input(bias_v, guard);
  auto gates = Input(gates_v, guard), dirs = Input(dirs_v, guard);

  auto scores = Output(s.scores_elems(), guard);
  auto o_softmax = Output(s.out_elems(), guard);
  auto o_attention = Output(s.out_elems(), guard);
  auto y = Output(s.y_elems(), guard);
  auto y_ex = Output(s.y_elems(), guard);
  auto per_head_ex = Output(s.per_head_elems(), guard);
  auto y_only = Output(s.y_elems(), guard);
  auto per_head_only = Output(s.per_head_elems(), guard);
  auto attribution = Output(rows * size_t(R), guard);
  auto attribution_basis = Output(rows * size_t(R), guard);
  auto norms = Output(rows, guard);

  headsum_status st;
  st = headsum_qk_scores(&a, q->data(), k->data(), scores->data());
  if (st != HEADSUM_OK) return CallFailed("qk_scores", st);
  st = headsum_softmax_v(&a, scores_in->data(), v->data(), o_softmax->data());
  if (st != HEADSUM_OK) return CallFailed("softmax_v", st);
  st = headsum_attention(&a, q->data(), k->data(), v->data(), o_attention->data());
  if (st != HEADSUM_OK) return CallFailed("attention", st);
  st = headsum_project_heads_sum(&p, heads->data(), wo->data(), bias->data(), y->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), bias->data(), gates->data(),
                                    y_ex->data(), per_head_ex->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(y, per_head)", st);
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), bias->data(), gates->data(),
                                    y_only->data(), nullptr);
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(y only)", st);
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), nullptr, nullptr, nullptr,
                                    per_head_only->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(per_head only)", st);
  st = headsum_head_attribution(&p, heads->data(), wo->data(), dirs->data(), R,
                                attribution->data());
  if (st != HEADSUM_OK) return CallFailed("head_attribution", st);
  headsum_attribution_basis* basis = nullptr;
  st = headsum_attribution_basis_create(&p, wo->data(), dirs->data(), R, &basis);
  if (st != HEADSUM_OK) return CallFailed("attribution_basis_create", st);
  st = headsum_head_attribution_basis(&p, heads->data(), basis, attribution_basis->data());
  headsum_attribution_basis_free(basis);
  if (st != HEADSUM_OK) return CallFailed("head_attribution_basis", st);
  st = headsum_head_contribution_norms(&p, heads->data(), wo->data(), norms->data());
  if (st != HEADSUM_OK) return CallFailed("head_contribution_norms", st);

  // No output element is left unwritten (12345 is no result these inputs give).
  const std::pair<const char*, const GuardedBuffer*> outputs[] = {
      {"qk_scores", scores.get()},
      {"softmax_v", o_softmax.get()},
      {"attention", o_attention.get()},
      {"project_heads_sum", y.get()},
      {"project_heads_sum_ex y", y_ex.get()},
      {"project_heads_sum_ex per_head", per_head_ex.get()},
      {"project_heads_sum_ex(y only)", y_only.get()},
      {"project_heads_sum_ex(per_head only)", per_head_only.get()},
      {"head_attribution", attribution.get()},
      {"head_attribution_basis", attribution_basis.get()},
      {"head_contribution_norms", norms.get()},
  };
  for (const auto& o : outputs) {
    testing::AssertionResult r = AllWritten(o.first, *o.second);
    if (!r) return r;
  }
  if (!check_reference) return testing::AssertionSuccess();

  const RefAttnDims ad(a);
  testing::AssertionResult r =
      Within("qk_scores", RefQkScores(ad, q_v.data(), k_v.data()),
             QkScoresBound(ad, q_v.data(), k_v.data()), *scores, ScoresLayout(s));
  if (!r) return r;
  r = Within("softmax_v", RefSoftmaxV(ad, scores_v.data(), v_v.data()),
             SoftmaxVBound(ad, scores_v.data(), v_v.data()), *o_softmax, HeadsLayout(s));
  if (!r) return r;
  r = Within("attention", RefAttention(ad, q_v.data(), k_v.data(), v_v.data()),
             AttentionBound(ad, q_v.data(), k_v.data(), v_v.data()), *o_attention,
             HeadsLayout(s));
  if (!r) return r;

  const RefProjDims pd(p);
  const std::vector<double> c = RefHeadContributions(pd, heads_v.data(), wo_v.data());
  const std::vector<double> abs_c = AbsContributions(pd, heads_v.data(), wo_v.data());
  r = Within("project_heads_sum", RefGatedSum(pd, c, nullptr, bias_v.data()),
             ProjectionBound(pd, abs_c, nullptr, bias_v.data()), *y, YLayout(s));
  if (!r) return r;
  const std::vector<double> gated = RefGatedSum(pd, c, gates_v.data(), bias_v.data());
  const std::vector<double> gated_bound =
      ProjectionBound(pd, abs_c, gates_v.data(), bias_v.data());
  r = Within("project_heads_sum_ex y", gated, gated_bound, *y_ex, YLayout(s));
  if (!r) return r;
  r = Within("project_heads_sum_ex(y only)", gated, gated_bound, *y_only, YLayout(s));
  if (!r) return r;
  const std::vector<double> c_bound = ContributionBound(pd, abs_c);
  r = Within("project_heads_sum_ex per_head", c, c_bound, *per_head_ex,
             PerHeadLayout(s, s.model_dim, 'd'));
  if (!r) return r;
  r = Within("project_heads_sum_ex(per_head only)", c, c_bound, *per_head_only,
             PerHeadLayout(s, s.model_dim, 'd'));
  if (!r) return r;
  const std::vector<double> attr = RefAttribution(pd, c, dirs_v.data(), R);
  const std::vector<double> attr_bound =
      AttributionBound(pd, heads_v.data(), wo_v.data(), dirs_v.data(), R);
  r = Within("head_attribution", attr, attr_bound, *attribution, PerHeadLayout(s, R, 'r'));
  if (!r) return r;
  r = Within("head_attribution_basis", attr, attr_bound, *attribution_basis,
             PerHeadLayout(s, R, 'r'));
  if (!r) return r;
  return Within("head_contribution_norms", RefContributionNorms(pd, c),
                ContributionNormsBound(pd, c, abs_c), *norms, PerHeadLayout(s, 1, 'n'));
}

class GuardPages : public TargetTest {
 protected:
  void RunSweep(Guard guard) {
    const std::vector<MhaShape> shapes = GuardShapes();
    size_t tried = 0, checked_against_reference = 0;
    ForEachShape(shapes, [&](const MhaShape& s, uint64_t n) {
      // A different sixteenth of the sweep per guard side, plus the extra
      // tiling shapes once.
      const size_t phase = guard == Guard::kAfterLast ? 0 : 16;
      const bool extra = n >= shapes.size() - ExtraTilingShapes().size();
      const bool check = extra ? guard == Guard::kAfterLast : n % 32 == phase;
      ++tried;
      checked_against_reference += check;
      return RunAllKernelsGuarded(s, n, guard, check);
    });
    std::printf("[ GUARDED  ] %s, %s: %zu shapes tried x 11 kernel calls "
                "(%zu of them also checked against the reference)\n",
                GetParam().c_str(), GuardName(guard), tried, checked_against_reference);
    RecordProperty("shapes_tried", int(tried));
  }
};

TEST_P(GuardPages, EveryKernelStaysInsideBuffersEndingAtAProtectedPage) {
  RunSweep(Guard::kAfterLast);
}

TEST_P(GuardPages, EveryKernelStaysInsideBuffersStartingAfterAProtectedPage) {
  RunSweep(Guard::kBeforeFirst);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(GuardPages);

}  // namespace
}  // namespace headsum_test
