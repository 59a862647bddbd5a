// Resource limits.
//
// 1. A shape whose tensors could not exist (an element count past size_t, or
//    past the documented maximum of PTRDIFF_MAX / 4 elements, i.e. a byte
//    size past PTRDIFF_MAX) is refused with HEADSUM_ERR_INVALID_ARGUMENT
//    before anything is touched: every input pointer points at PROT_NONE
//    memory (a single read faults), every output holds sentinels that must
//    survive.  Each case makes exactly one tensor too large, so a check that
//    forgets that tensor is caught.
// 2. Running out of memory inside the library returns
//    HEADSUM_ERR_OUT_OF_MEMORY, writes no output and leaves the library
//    working: every allocation point is made to fail in turn through the test
//    hook headsum::testing::FailAllocationsAfter (dispatch/test_hooks.h), and
//    once for real with a request no address space can hold.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../dispatch/test_hooks.h"  // the library's internal test hook
#include "headsum/headsum.h"
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

constexpr int64_t P(int n) { return int64_t{1} << n; }
// The documented maximum element count of one tensor.
constexpr uint64_t kMaxElements = uint64_t(PTRDIFF_MAX) / sizeof(float);
static_assert(kMaxElements + 1 == uint64_t{1} << 61, "2^61 is the first count refused");
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

size_t PageSize() { return size_t(sysconf(_SC_PAGESIZE)); }

// Two pages nobody may read or write: every input pointer of a call that
// must be refused points here.
const float* NoAccess() {
  static void* const region = [] {
    void* p = mmap(nullptr, 2 * PageSize(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    return p;
  }();
  return static_cast<const float*>(region);
}

// An output: one page of sentinels right before a PROT_NONE page.
class SentinelOutput {
 public:
  SentinelOutput() {
    const size_t page = PageSize();
    void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    map_ = static_cast<float*>(p);
    mprotect(static_cast<char*>(p) + page, page, PROT_NONE);
    n_ = page / sizeof(float);
    for (size_t i = 0; i < n_; ++i) map_[i] = kSentinel;
  }
  ~SentinelOutput() { munmap(map_, 2 * PageSize()); }
  SentinelOutput(const SentinelOutput&) = delete;
  SentinelOutput& operator=(const SentinelOutput&) = delete;
  float* data() { return map_; }
  size_t Written() const {
    size_t w = 0;
    for (size_t i = 0; i < n_; ++i) w += !(map_[i] == kSentinel);
    return w;
  }

 private:
  float* map_;
  size_t n_;
};

// ---- 1. shapes whose tensors could not exist ---------------------------------------------

struct Refusal {
  std::string what;
  std::function<headsum_status(float* out, float* out2, headsum_attribution_basis** basis)> call;
};

std::string Describe(const headsum_attn_shape& s) {
  return "B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads) +
         " Hkv=" + std::to_string(s.kv_heads) + " Sq=" + std::to_string(s.seq_q) +
         " Skv=" + std::to_string(s.seq_kv) + " L=" + std::to_string(s.head_dim);
}
std::string Describe(const headsum_proj_shape& s) {
  return "B=" + std::to_string(s.batch) + " S=" + std::to_string(s.seq) +
         " H=" + std::to_string(s.heads) + " L=" + std::to_string(s.head_dim) +
         " D=" + std::to_string(s.model_dim);
}

headsum_attn_shape Attn(int64_t b, int64_t h, int64_t hkv, int64_t sq, int64_t skv, int64_t l,
                        int causal = 0) {
  headsum_attn_shape s;
  s.batch = b;
  s.heads = h;
  s.kv_heads = hkv;
  s.seq_q = sq;
  s.seq_kv = skv;
  s.head_dim = l;
  s.scale = 0.0f;
  s.causal = causal;
  return s;
}

// Attention shapes, each with one tensor past the limit (the others fit).
std::vector<std::pair<std::string, headsum_attn_shape>> ImpossibleAttnShapes() {
  return {
      {"Q/O has 2^61 elements (2^63 bytes)", Attn(1, 1, 0, P(31), 1, P(30))},
      {"Q/O has 2^61 elements through batch * heads", Attn(P(20), P(20), 1, 1, 1, P(21))},
      {"K/V have 2^61 elements", Attn(1, 1, 0, 1, P(31), P(30))},
      {"K/V have 2^61 elements through kv_heads", Attn(1, P(20), P(20), 1, P(20), P(21))},
      {"scores have 2^61 elements", Attn(1, 1, 0, P(31), P(30), 1, 1)},
      {"scores have 2^66 elements (past size_t)", Attn(1, 1, 0, P(33), P(33), 1)},
      {"Q has 2^64 elements (wraps to 0)", Attn(1, 1, 0, P(32), 1, P(32))},
      {"Q, K/V, scores have 2^62 elements (bytes wrap size_t)", Attn(1, P(62), 0, 1, 1, 1)},
      {"batch = INT64_MAX", Attn(kInt64Max, 1, 0, 1, 1, 1)},
      {"every dim INT64_MAX", Attn(kInt64Max, kInt64Max, 0, kInt64Max, kInt64Max, kInt64Max)},
  };
}

headsum_proj_shape Proj(int64_t b, int64_t s, int64_t h, int64_t l, int64_t d) {
  return headsum_proj_shape{b, s, h, l, d};
}

std::vector<Refusal> Refusals() {
  std::vector<Refusal> r;
  const float* const x = NoAccess();
  for (const auto& c : ImpossibleAttnShapes()) {
    const headsum_attn_shape s = c.second;
    const std::string at = " with " + c.first + " (" + Describe(s) + ")";
    r.push_back({"qk_scores" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_qk_scores(&s, x, x, out);
                 }});
    r.push_back({"softmax_v" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_softmax_v(&s, x, x, out);
                 }});
    r.push_back({"attention" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_attention(&s, x, x, x, out);
                 }});
  }

  // Projection shapes with heads, wo or y past the limit: every projection
  // function reads heads and wo (or writes y), so each must refuse.
  const std::vector<std::pair<std::string, headsum_proj_shape>> proj = {
      {"heads has 2^61 elements", Proj(1, P(31), 1, P(30), 1)},
      {"wo has 2^61 elements", Proj(1, 1, 1, P(31), P(30))},
      {"wo has 2^61 elements through heads * model_dim", Proj(1, 1, P(21), 1, P(40))},
      {"y has 2^61 elements", Proj(1, P(31), 1, 1, P(30))},
      {"heads and y have 2^66 elements (past size_t)", Proj(P(33), P(33), 1, 1, 1)},
      {"wo has 2^64 elements (wraps to 0)", Proj(1, 1, P(32), P(16), P(16))},
      {"every dim INT64_MAX", Proj(kInt64Max, kInt64Max, kInt64Max, kInt64Max, kInt64Max)},
  };
  for (const auto& c : proj) {
    const headsum_proj_shape s = c.second;
    const std::string at = " with " + c.first + " (" + Describe(s) + ")";
    r.push_back({"project_heads_sum" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_project_heads_sum(&s, x, x, x, out);
                 }});
    r.push_back({"project_heads_sum_ex(y, per_head)" + at,
                 [=](float* out, float* out2, headsum_attribution_basis**) {
                   return headsum_project_heads_sum_ex(&s, x, x, x, x, out, out2);
                 }});
    r.push_back({"project_heads_sum_ex(y only)" + at,
                 [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_project_heads_sum_ex(&s, x, x, x, x, out, nullptr);
                 }});
    r.push_back({"project_heads_sum_ex(per_head only)" + at,
                 [=](float*, float* out2, headsum_attribution_basis**) {
                   return headsum_project_heads_sum_ex(&s, x, x, x, x, nullptr, out2);
                 }});
    r.push_back({"head_attribution" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_attribution(&s, x, x, x, 1, out);
                 }});
    r.push_back({"head_contribution_norms" + at,
                 [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_contribution_norms(&s, x, x, out);
                 }});
    // basis_create only reads wo and directions ("only heads, head_dim and
    // model_dim matter"): a too large heads or y tensor is not its business.
    if (c.first.find("wo") != std::string::npos || c.first.find("INT64_MAX") != std::string::npos) {
      r.push_back({"attribution_basis_create" + at,
                   [=](float*, float*, headsum_attribution_basis** basis) {
                     return headsum_attribution_basis_create(&s, x, x, 1, basis);
                   }});
      r.push_back({"wo_pack" + at, [=](float*, float*, headsum_attribution_basis**) {
                     headsum_wo_packed* const kUntouchedPacked =
                         reinterpret_cast<headsum_wo_packed*>(uintptr_t{0x9ac4});
                     headsum_wo_packed* packed = kUntouchedPacked;
                     const headsum_status st = headsum_wo_pack(&s, x, &packed);
                     EXPECT_EQ(packed, kUntouchedPacked) << "*packed was written";
                     return st;
                   }});
    }
  }

  // per_head [B][S][H][D] alone past the limit (heads 2^41, y 2^41, wo 2^40).
  {
    const headsum_proj_shape s = Proj(1, P(21), P(20), 1, P(20));
    const std::string at = " with per_head of 2^61 elements (" + Describe(s) + ")";
    r.push_back({"project_heads_sum_ex(y, per_head)" + at,
                 [=](float* out, float* out2, headsum_attribution_basis**) {
                   return headsum_project_heads_sum_ex(&s, x, x, nullptr, nullptr, out, out2);
                 }});
    r.push_back({"project_heads_sum_ex(per_head only)" + at,
                 [=](float*, float* out2, headsum_attribution_basis**) {
                   return headsum_project_heads_sum_ex(&s, x, x, nullptr, nullptr, nullptr, out2);
                 }});
  }
  // Attribution: out [B][S][H][R], directions [R][D], Wo directions^T
  // [H*L][R], each alone past the limit.
  {
    const headsum_proj_shape s = Proj(1, P(31), 1, 1, 1);
    const std::string at = " with out of 2^61 elements (" + Describe(s) + ", R=2^30)";
    r.push_back({"head_attribution" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_attribution(&s, x, x, x, P(30), out);
                 }});
  }
  {
    const headsum_proj_shape s = Proj(1, 1, 1, 1, P(30));
    const std::string at = " with directions of 2^61 elements (" + Describe(s) + ", R=2^31)";
    r.push_back({"head_attribution" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_attribution(&s, x, x, x, P(31), out);
                 }});
    r.push_back({"attribution_basis_create" + at,
                 [=](float*, float*, headsum_attribution_basis** basis) {
                   return headsum_attribution_basis_create(&s, x, x, P(31), basis);
                 }});
  }
  {
    const headsum_proj_shape s = Proj(1, 1, 1, P(31), 1);
    const std::string at = " with Wo directions^T of 2^61 elements (" + Describe(s) + ", R=2^30)";
    r.push_back({"head_attribution" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_attribution(&s, x, x, x, P(30), out);
                 }});
    r.push_back({"attribution_basis_create" + at,
                 [=](float*, float*, headsum_attribution_basis** basis) {
                   return headsum_attribution_basis_create(&s, x, x, P(30), basis);
                 }});
  }
  {
    const headsum_proj_shape s = Proj(1, 1, 1, 1, 1);
    const std::string at = " with n_directions = INT64_MAX (" + Describe(s) + ")";
    r.push_back({"head_attribution" + at, [=](float* out, float*, headsum_attribution_basis**) {
                   return headsum_head_attribution(&s, x, x, x, kInt64Max, out);
                 }});
    r.push_back({"attribution_basis_create" + at,
                 [=](float*, float*, headsum_attribution_basis** basis) {
                   return headsum_attribution_basis_create(&s, x, x, kInt64Max, basis);
                 }});
  }
  return r;
}

TEST(ResourceLimits, ShapesWhoseTensorsCouldNotExistAreRefusedBeforeAnythingIsTouched) {
  const std::vector<Refusal> cases = Refusals();
  headsum_attribution_basis* const kUntouchedBasis =
      reinterpret_cast<headsum_attribution_basis*>(uintptr_t{0x5e47});
  int refused = 0;
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.what);
    SentinelOutput out, out2;
    headsum_attribution_basis* basis = kUntouchedBasis;
    const headsum_status st = c.call(out.data(), out2.data(), &basis);
    EXPECT_EQ(st, HEADSUM_ERR_INVALID_ARGUMENT) << StatusName(st);
    EXPECT_NE(std::string(headsum_last_error()), "");
    EXPECT_EQ(out.Written(), 0u) << "an output was written";
    EXPECT_EQ(out2.Written(), 0u) << "an output was written";
    EXPECT_EQ(basis, kUntouchedBasis) << "*basis was written";
    refused += st == HEADSUM_ERR_INVALID_ARGUMENT;
  }
  std::printf("[ LIMITS   ] %d of %zu impossible shapes refused with INVALID_ARGUMENT\n", refused,
              cases.size());
}

// head_attribution_basis: out [B][S][H][R] past the limit although the
// basis is real (R = 2^20, H = L = D = 1) and heads [B][H][S][L] is not.
TEST(ResourceLimits, AttributionThroughABasisRefusesAnOutputThatCouldNotExist) {
  const int64_t R = P(20);
  const std::vector<float> wo = {1.0f};
  const std::vector<float> dirs = RandomUniform(size_t(R), -1, 1, 3);
  const headsum_proj_shape small = Proj(1, 1, 1, 1, 1);
  headsum_attribution_basis* basis = nullptr;
  ASSERT_EQ(headsum_attribution_basis_create(&small, wo.data(), dirs.data(), R, &basis),
            HEADSUM_OK)
      << headsum_last_error();
  const headsum_proj_shape huge = Proj(1, P(41), 1, 1, 1);  // out 2^61, heads 2^41
  SentinelOutput out;
  EXPECT_EQ(headsum_head_attribution_basis(&huge, NoAccess(), basis, out.data()),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out.Written(), 0u);
  headsum_attribution_basis_free(basis);
}

// ---- 2. out of memory ---------------------------------------------------------------------

// Turns the allocation hook off again whatever happens in a test.
struct HookOff {
  ~HookOff() { headsum::testing::FailAllocationsAfter(-1); }
};

struct OomJob {
  std::string name;
  bool must_allocate;  // the documented algorithm needs a buffer of its own
  std::vector<size_t> out_elems;
  // Writes into outs; basis receives a created basis (or stays untouched).
  std::function<headsum_status(std::vector<std::vector<float>>& outs,
                               headsum_attribution_basis** basis)>
      run;
};

struct OomInputs {
  explicit OomInputs(const MhaShape& s)
      : q(RandomUniform(s.q_elems(), -1, 1, 1)),
        k(RandomUniform(s.kv_elems(), -1, 1, 2)),
        v(RandomUniform(s.kv_elems(), -1, 1, 3)),
        scores(RandomUniform(s.scores_elems(), -3, 3, 4)),
        heads(RandomUniform(s.out_elems(), -1, 1, 5)),
        wo(RandomUniform(s.wo_elems(), -1, 1, 6)),
        bias(RandomUniform(size_t(s.model_dim), -1, 1, 7)),
        gates(RandomUniform(size_t(s.heads), -1, 1, 8)),
        dirs(RandomUniform(size_t(3 * s.model_dim), -1, 1, 9)) {}
  std::vector<float> q, k, v, scores, heads, wo, bias, gates, dirs;
};

std::vector<OomJob> OomJobs(const MhaShape& s, const OomInputs& in, bool decode) {
  const headsum_attn_shape a = s.attn();
  const headsum_proj_shape p = s.proj();
  const size_t rows = size_t(s.batch * s.seq_q * s.heads);
  const OomInputs* x = &in;
  const std::string at = " at " + s.name();
  std::vector<OomJob> jobs = {
      {"qk_scores" + at, false, {s.scores_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_qk_scores(&a, x->q.data(), x->k.data(), o[0].data());
       }},
      {"softmax_v" + at, false, {s.out_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_softmax_v(&a, x->scores.data(), x->v.data(), o[0].data());
       }},
      // Decode with >= 1024 keys splits the keys and needs partials.
      {"attention" + at, decode, {s.out_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_attention(&a, x->q.data(), x->k.data(), x->v.data(), o[0].data());
       }},
  };
  if (decode) return jobs;
  headsum_wo_packed* made = nullptr;
  EXPECT_EQ(headsum_wo_pack(&p, in.wo.data(), &made), HEADSUM_OK) << headsum_last_error();
  const std::shared_ptr<headsum_wo_packed> packed(made, headsum_wo_free);
  const std::vector<OomJob> proj = {
      {"project_heads_sum" + at, false, {s.y_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_project_heads_sum(&p, x->heads.data(), x->wo.data(), x->bias.data(),
                                          o[0].data());
       }},
      {"project_heads_sum_packed" + at, false, {s.y_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_project_heads_sum_packed(&p, x->heads.data(), packed.get(),
                                                 x->bias.data(), o[0].data());
       }},
      {"project_heads_sum_ex" + at, false, {s.y_elems(), s.per_head_elems()},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_project_heads_sum_ex(&p, x->heads.data(), x->wo.data(), x->bias.data(),
                                             x->gates.data(), o[0].data(), o[1].data());
       }},
      // Wo directions^T [H*L][R], once per call.
      {"head_attribution" + at, true, {rows * 3},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_head_attribution(&p, x->heads.data(), x->wo.data(), x->dirs.data(), 3,
                                         o[0].data());
       }},
      // The basis [H*L][R] itself.
      {"attribution_basis_create" + at, true, {},
       [=](std::vector<std::vector<float>>&, headsum_attribution_basis** basis) {
         return headsum_attribution_basis_create(&p, x->wo.data(), x->dirs.data(), 3, basis);
       }},
      {"head_contribution_norms" + at, false, {rows},
       [=](std::vector<std::vector<float>>& o, headsum_attribution_basis**) {
         return headsum_head_contribution_norms(&p, x->heads.data(), x->wo.data(), o[0].data());
       }},
  };
  jobs.insert(jobs.end(), proj.begin(), proj.end());
  return jobs;
}

// headsum_wo_pack needs the packed copy: without it, OUT_OF_MEMORY, a
// message, and *packed untouched; with it, the same handle as without the hook.
TEST(ResourceLimits, PackingWoWithoutMemoryFailsCleanly) {
  HookOff off;
  const MhaShape s{1, 4, 4, 5, 5, 16, 33, false};
  const OomInputs in(s);
  const headsum_proj_shape p = s.proj();
  headsum_wo_packed* const kUntouchedPacked = reinterpret_cast<headsum_wo_packed*>(uintptr_t{0x9ac5});
  headsum_wo_packed* packed = kUntouchedPacked;
  headsum::testing::FailAllocationsAfter(0);
  const headsum_status st = headsum_wo_pack(&p, in.wo.data(), &packed);
  headsum::testing::FailAllocationsAfter(-1);
  EXPECT_EQ(st, HEADSUM_ERR_OUT_OF_MEMORY) << StatusName(st);
  EXPECT_NE(std::string(headsum_last_error()).find("memory"), std::string::npos)
      << headsum_last_error();
  EXPECT_EQ(packed, kUntouchedPacked) << "*packed written although the allocation failed";
  ASSERT_EQ(headsum_wo_pack(&p, in.wo.data(), &packed), HEADSUM_OK) << headsum_last_error();
  std::vector<float> y = Sentinels(s.y_elems()), y_plain = Sentinels(s.y_elems());
  EXPECT_EQ(headsum_project_heads_sum_packed(&p, in.heads.data(), packed, nullptr, y.data()),
            HEADSUM_OK);
  EXPECT_EQ(headsum_project_heads_sum(&p, in.heads.data(), in.wo.data(), nullptr, y_plain.data()),
            HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(y_plain, y, Layout{{int64_t(y.size())}, "n"}));
  headsum_wo_free(packed);
}

class OutOfMemory : public TargetTest {
 protected:
  void TearDown() override {
    headsum::testing::FailAllocationsAfter(-1);
    EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
    TargetTest::TearDown();
  }
};

// For n = 0, 1, 2, ...: the first n allocations of the call succeed, the rest
// fail.  Until n covers every allocation the call makes, it must return
// HEADSUM_ERR_OUT_OF_MEMORY with a message, write no output (and no *basis);
// then it must succeed with the result of a call without the hook.
TEST_P(OutOfMemory, EveryAllocationFailureReturnsOutOfMemoryAndWritesNothing) {
  HookOff off;
  const MhaShape shapes[] = {MhaShape{2, 4, 2, 17, 65, 16, 33, true},
                             MhaShape{1, 4, 1, 1, 1537, 16, 17, false}};
  headsum_attribution_basis* const kUntouched =
      reinterpret_cast<headsum_attribution_basis*>(uintptr_t{0xba515});
  int calls = 0, failed_calls = 0;
  for (const int threads : {1, 3}) {
    ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
    for (const MhaShape& s : shapes) {
      const bool decode = s.seq_kv >= 1024;
      const OomInputs in(s);
      for (const OomJob& job : OomJobs(s, in, decode)) {
        SCOPED_TRACE(job.name + ", " + std::to_string(threads) + " threads");
        auto fresh = [&] {
          std::vector<std::vector<float>> outs;
          for (size_t n : job.out_elems) outs.push_back(Sentinels(n));
          return outs;
        };
        // Without the hook.
        std::vector<std::vector<float>> expected = fresh();
        headsum_attribution_basis* basis = nullptr;
        ASSERT_EQ(job.run(expected, &basis), HEADSUM_OK) << headsum_last_error();
        headsum_attribution_basis_free(basis);

        int failures = 0;
        bool succeeded = false;
        for (long n = 0; n <= 16 && !succeeded; ++n) {
          std::vector<std::vector<float>> outs = fresh();
          basis = kUntouched;
          headsum::testing::FailAllocationsAfter(n);
          const headsum_status st = job.run(outs, &basis);
          headsum::testing::FailAllocationsAfter(-1);
          if (st == HEADSUM_OK) {
            succeeded = true;
            for (size_t o = 0; o < outs.size(); ++o) {
              const Layout flat{{int64_t(outs[o].size())}, "n"};
              EXPECT_TRUE(BitwiseEqual(expected[o], outs[o], flat))
                  << "output #" << o << " after " << n << " allocations were allowed";
            }
            if (job.out_elems.empty()) {
              EXPECT_NE(basis, kUntouched);
              if (basis != kUntouched) headsum_attribution_basis_free(basis);
            }
            continue;
          }
          ++failures;
          EXPECT_EQ(st, HEADSUM_ERR_OUT_OF_MEMORY)
              << StatusName(st) << " with allocation #" << n << " failing: "
              << headsum_last_error();
          const std::string msg = headsum_last_error();
          EXPECT_NE(msg.find("memory"), std::string::npos) << "message: \"" << msg << "\"";
          for (size_t o = 0; o < outs.size(); ++o) {
            size_t written = 0;
            for (float v : outs[o]) written += !(v == kSentinel);
            EXPECT_EQ(written, 0u) << "output #" << o << " written although allocation #" << n
                                   << " failed";
          }
          EXPECT_EQ(basis, kUntouched) << "*basis written although allocation #" << n
                                       << " failed";
        }
        EXPECT_TRUE(succeeded) << "still failing with 17 allocations allowed";
        ++calls;
        failed_calls += failures;
        if (job.must_allocate) {
          EXPECT_GT(failures, 0)
              << "the call needs a buffer of its own, yet no allocation failed: its "
                 "allocations do not go through headsum::dispatch::AllocateFloats";
        }
      }
    }
  }
  std::printf("[ OOM      ] %s: %d kernel calls, %d injected allocation failures, each "
              "HEADSUM_ERR_OUT_OF_MEMORY with no output written\n",
              GetParam().c_str(), calls, failed_calls);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(OutOfMemory);

// A real allocation failure, no hook: head_attribution and
// attribution_basis_create with H*L = R = 2^26 and D = 1 need a [H*L][R]
// buffer of 2^52 floats (16 PiB), more than any address space holds, so the
// allocator fails.  Both must return HEADSUM_ERR_OUT_OF_MEMORY (not abort,
// not crash), write nothing (the output is mapped read-only: a write
// faults) and leave *basis alone; the library then still works.  The
// 256 MiB inputs are untouched anonymous mappings (no memory is used).
// (Not under AddressSanitizer, whose allocator aborts on such a request.)
TEST(ResourceLimits, RealAllocationFailureReturnsOutOfMemory) {
#ifdef HEADSUM_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer's allocator aborts on a 16 PiB request";
#else
  const int64_t n = P(26);
  const size_t bytes = size_t(n) * sizeof(float);
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* const in = mmap(nullptr, bytes, PROT_READ, flags, -1, 0);
  void* const out = mmap(nullptr, bytes, PROT_READ, flags, -1, 0);
  ASSERT_NE(in, MAP_FAILED);
  ASSERT_NE(out, MAP_FAILED);
  const float* x = static_cast<const float*>(in);
  const headsum_proj_shape p = Proj(1, 1, 1, n, 1);  // heads [1][1][1][2^26], wo [2^26][1]
  for (const int threads : {1, 0}) {
    ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
    EXPECT_EQ(headsum_head_attribution(&p, x, x, x, n, static_cast<float*>(out)),
              HEADSUM_ERR_OUT_OF_MEMORY)
        << headsum_last_error();
    EXPECT_NE(std::string(headsum_last_error()).find("memory"), std::string::npos)
        << headsum_last_error();
    headsum_attribution_basis* const untouched =
        reinterpret_cast<headsum_attribution_basis*>(uintptr_t{0xba515});
    headsum_attribution_basis* basis = untouched;
    EXPECT_EQ(headsum_attribution_basis_create(&p, x, x, n, &basis), HEADSUM_ERR_OUT_OF_MEMORY)
        << headsum_last_error();
    EXPECT_EQ(basis, untouched);
  }
  munmap(in, bytes);
  munmap(out, bytes);
  // Still working.
  const headsum_proj_shape small = Proj(1, 2, 2, 3, 5);
  const std::vector<float> heads = RandomUniform(12, -1, 1, 1), wo = RandomUniform(30, -1, 1, 2);
  const std::vector<float> dirs = RandomUniform(10, -1, 1, 3);
  std::vector<float> attribution = Sentinels(8);
  EXPECT_EQ(headsum_head_attribution(&small, heads.data(), wo.data(), dirs.data(), 2,
                                     attribution.data()),
            HEADSUM_OK)
      << headsum_last_error();
  EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
#endif
}

}  // namespace
}  // namespace headsum_test
