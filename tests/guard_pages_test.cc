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
#include <signal.h>
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
#include "../dispatch/test_hooks.h"  // the streaming threshold
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define HEADSUM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEADSUM_TEST_ASAN 1
#endif
#endif

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

// ---- naming the culprit when a guard page is hit ------------------------------------------
// The fault kills the test process; before it does, a SIGSEGV handler
// writes which kernel call, shape and buffer hit which guard page, then
// hands the fault on to the previous handler (the default, or a sanitizer's).

struct GuardRecord {
  const char* name;
  uintptr_t guard_begin, guard_end;  // the PROT_NONE page
  uintptr_t data_begin, data_end;    // the buffer
};
constexpr int kMaxRecords = 32;
GuardRecord g_records[kMaxRecords];
volatile sig_atomic_t g_record_count = 0;
const char* volatile g_current_call = "";
char g_current_shape[160] = "";
const char* volatile g_current_guard = "";
struct sigaction g_previous_segv;

void WriteStr(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  ssize_t ignored = write(STDERR_FILENO, text, n);
  (void)ignored;
}
void WriteHex(uintptr_t x) {
  char buf[2 + 16 + 1];
  buf[0] = '0';
  buf[1] = 'x';
  for (int i = 0; i < 16; ++i) buf[2 + i] = "0123456789abcdef"[(x >> (60 - 4 * i)) & 15];
  buf[18] = '\0';
  WriteStr(buf);
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  WriteStr("\n[ GUARD HIT ] ");
  WriteStr(g_current_call);
  WriteStr(" at ");
  WriteStr(g_current_shape);
  WriteStr(" (");
  WriteStr(g_current_guard);
  WriteStr("): fault at ");
  WriteHex(at);
  for (int r = 0; r < g_record_count; ++r) {
    const GuardRecord& g = g_records[r];
    if (at >= g.guard_begin && at < g.guard_end) {
      WriteStr(", in the guard page of ");
      WriteStr(g.name);
      WriteStr(at < g.data_begin ? " (before its first element)" : " (past its last element)");
    } else if (at >= g.data_begin && at < g.data_end) {
      WriteStr(", inside ");
      WriteStr(g.name);
      WriteStr(" (an input: written?)");
    }
  }
  WriteStr("\n");
  // Hand on to the previous handler: restore it and return, so the faulting
  // access runs again under it.
  sigaction(SIGSEGV, &g_previous_segv, nullptr);
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    if (g_previous_segv.sa_sigaction != nullptr) g_previous_segv.sa_sigaction(sig, info, context);
  }
}

class ScopedSegvReporter {
 public:
  ScopedSegvReporter() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
  }
  ~ScopedSegvReporter() { sigaction(SIGSEGV, &g_previous_segv, nullptr); }
};

// n floats in their own mapping, flush against a PROT_NONE page.  With
// kAfterLast the buffer ends where the guard page begins (so it starts at
// whatever 4-byte alignment n gives it); with kBeforeFirst it starts where
// the guard page ends (page-aligned).
class GuardedBuffer {
 public:
  GuardedBuffer(size_t n, Guard guard, const char* name = "a buffer") : n_(n) {
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
    if (g_record_count < kMaxRecords) {
      const uintptr_t g = reinterpret_cast<uintptr_t>(guard_page_);
      const uintptr_t d = reinterpret_cast<uintptr_t>(data_);
      g_records[g_record_count] = {name, g, g + page, d, d + bytes};
      g_record_count = g_record_count + 1;
    }
  }
  GuardedBuffer(const std::vector<float>& values, Guard guard, const char* name)
      : GuardedBuffer(values.size(), guard, name) {
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

std::unique_ptr<GuardedBuffer> Input(const char* name, const std::vector<float>& values,
                                     Guard guard) {
  auto b = std::make_unique<GuardedBuffer>(values, guard, name);
  b->MakeReadOnly();
  return b;
}
std::unique_ptr<GuardedBuffer> Output(const char* name, size_t n, Guard guard) {
  return std::make_unique<GuardedBuffer>(Sentinels(n), guard, name);
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

// The sweep and the extra shapes.  Under AddressSanitizer (the sanitizer
// suite), whose instrumented kernels run ~10x slower and which checks heap
// bounds itself, every third shape of the sweep.
std::vector<MhaShape> GuardShapes() {
#ifdef HEADSUM_TEST_ASAN
  constexpr size_t kStride = 3;
#else
  constexpr size_t kStride = 1;
#endif
  const std::vector<MhaShape> sweep = SweepShapes();
  std::vector<MhaShape> shapes;
  for (size_t n = 0; n < sweep.size(); n += kStride) shapes.push_back(sweep[n]);
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

  g_record_count = 0;
  std::snprintf(g_current_shape, sizeof(g_current_shape), "%s (R=%d)", s.name().c_str(),
                int(R));
  g_current_guard = GuardName(guard);
  auto q = Input("q", q_v, guard), k = Input("k", k_v, guard), v = Input("v", v_v, guard);
  auto scores_in = Input("scores (input)", scores_v, guard);
  auto heads = Input("heads", heads_v, guard), wo = Input("wo", wo_v, guard);
  auto bias = Input("bias", bias_v, guard), gates = Input("head_gates", gates_v, guard);
  auto dirs = Input("directions", dirs_v, guard);

  auto scores = Output("scores", s.scores_elems(), guard);
  auto o_softmax = Output("out (softmax_v)", s.out_elems(), guard);
  auto o_attention = Output("out (attention)", s.out_elems(), guard);
  auto y = Output("y", s.y_elems(), guard);
  auto y_packed = Output("y (packed)", s.y_elems(), guard);
  auto y_ex = Output("y (ex)", s.y_elems(), guard);
  auto per_head_ex = Output("per_head (ex)", s.per_head_elems(), guard);
  auto y_only = Output("y (ex, y only)", s.y_elems(), guard);
  auto per_head_only = Output("per_head (ex, per_head only)", s.per_head_elems(), guard);
  auto attribution = Output("out (head_attribution)", rows * size_t(R), guard);
  auto attribution_basis = Output("out (head_attribution_basis)", rows * size_t(R), guard);
  auto norms = Output("out (head_contribution_norms)", rows, guard);

  headsum_status st;
  // Every other shape writes its scores with non-temporal stores.
  g_current_call = n % 2 ? "headsum_qk_scores (streamed)" : "headsum_qk_scores";
  headsum::testing::SetStreamScoresBytes(n % 2 ? 0 : headsum::testing::kDefaultStreamScoresBytes);
  st = headsum_qk_scores(&a, q->data(), k->data(), scores->data());
  headsum::testing::SetStreamScoresBytes(headsum::testing::kDefaultStreamScoresBytes);
  if (st != HEADSUM_OK) return CallFailed("qk_scores", st);
  g_current_call = "headsum_softmax_v";
  st = headsum_softmax_v(&a, scores_in->data(), v->data(), o_softmax->data());
  if (st != HEADSUM_OK) return CallFailed("softmax_v", st);
  g_current_call = "headsum_attention";
  st = headsum_attention(&a, q->data(), k->data(), v->data(), o_attention->data());
  if (st != HEADSUM_OK) return CallFailed("attention", st);
  g_current_call = "headsum_project_heads_sum";
  st = headsum_project_heads_sum(&p, heads->data(), wo->data(), bias->data(), y->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum", st);
  headsum_wo_packed* packed = nullptr;
  g_current_call = "headsum_wo_pack";
  st = headsum_wo_pack(&p, wo->data(), &packed);
  if (st != HEADSUM_OK) return CallFailed("wo_pack", st);
  g_current_call = "headsum_project_heads_sum_packed";
  st = headsum_project_heads_sum_packed(&p, heads->data(), packed, bias->data(),
                                        y_packed->data());
  headsum_wo_free(packed);
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_packed", st);
  g_current_call = "headsum_project_heads_sum_ex(y, per_head)";
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), bias->data(), gates->data(),
                                    y_ex->data(), per_head_ex->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(y, per_head)", st);
  g_current_call = "headsum_project_heads_sum_ex(y only)";
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), bias->data(), gates->data(),
                                    y_only->data(), nullptr);
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(y only)", st);
  g_current_call = "headsum_project_heads_sum_ex(per_head only)";
  st = headsum_project_heads_sum_ex(&p, heads->data(), wo->data(), nullptr, nullptr, nullptr,
                                    per_head_only->data());
  if (st != HEADSUM_OK) return CallFailed("project_heads_sum_ex(per_head only)", st);
  g_current_call = "headsum_head_attribution";
  st = headsum_head_attribution(&p, heads->data(), wo->data(), dirs->data(), R,
                                attribution->data());
  if (st != HEADSUM_OK) return CallFailed("head_attribution", st);
  headsum_attribution_basis* basis = nullptr;
  g_current_call = "headsum_attribution_basis_create";
  st = headsum_attribution_basis_create(&p, wo->data(), dirs->data(), R, &basis);
  if (st != HEADSUM_OK) return CallFailed("attribution_basis_create", st);
  g_current_call = "headsum_head_attribution_basis";
  st = headsum_head_attribution_basis(&p, heads->data(), basis, attribution_basis->data());
  headsum_attribution_basis_free(basis);
  if (st != HEADSUM_OK) return CallFailed("head_attribution_basis", st);
  g_current_call = "headsum_head_contribution_norms";
  st = headsum_head_contribution_norms(&p, heads->data(), wo->data(), norms->data());
  if (st != HEADSUM_OK) return CallFailed("head_contribution_norms", st);

  // No output element is left unwritten (12345 is no result these inputs give).
  const std::pair<const char*, const GuardedBuffer*> outputs[] = {
      {"qk_scores", scores.get()},
      {"softmax_v", o_softmax.get()},
      {"attention", o_attention.get()},
      {"project_heads_sum", y.get()},
      {"project_heads_sum_packed", y_packed.get()},
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
  r = Within("project_heads_sum_packed", RefConcatProject(pd, heads_v.data(), wo_v.data(), bias_v.data()),
             ProjectionBound(pd, abs_c, nullptr, bias_v.data()), *y_packed, YLayout(s));
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
    const ScopedSegvReporter reporter;
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
    std::printf("[ GUARDED  ] %s, %s: %zu shapes tried x 13 kernel calls "
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
