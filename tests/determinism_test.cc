// For a given target a result does not depend on the thread count (sums over
// heads and KV tiles run in a fixed order, no atomics) nor on the run:
// every kernel's output must be bitwise identical with 1, 2 and 8 threads and
// across repeated calls, at shapes that do not divide evenly among threads.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "headsum/headsum.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::DeterminismShapes;

// One kernel call with fixed inputs; returns its output(s), concatenated.
struct KernelRun {
  std::string name;
  std::function<std::vector<float>(headsum_status*)> run;
};

std::vector<KernelRun> AllKernels(const MhaShape& s, uint64_t seed) {
  struct Inputs {
    std::vector<float> q, k, v, scores, heads, wo, bias, gates, dirs;
  };
  auto in = std::make_shared<Inputs>();
  in->q = RandomUniform(s.q_elems(), -1, 1, 16 * seed + 1);
  in->k = RandomUniform(s.kv_elems(), -1, 1, 16 * seed + 2);
  in->v = RandomUniform(s.kv_elems(), -1, 1, 16 * seed + 3);
  in->scores = RandomUniform(s.scores_elems(), -4, 4, 16 * seed + 4);
  in->heads = RandomUniform(s.out_elems(), -1, 1, 16 * seed + 5);
  in->wo = RandomUniform(s.wo_elems(), -1, 1, 16 * seed + 6);
  in->bias = RandomUniform(size_t(s.model_dim), -1, 1, 16 * seed + 7);
  in->gates = RandomUniform(size_t(s.heads), -1.5f, 1.5f, 16 * seed + 8);
  constexpr int64_t R = 3;
  in->dirs = RandomUniform(size_t(R * s.model_dim), -1, 1, 16 * seed + 9);
  const headsum_attn_shape a = s.attn();
  const headsum_proj_shape p = s.proj();
  const size_t rows = size_t(s.batch * s.seq_q * s.heads);

  return {
      {"qk_scores",
       [=](headsum_status* st) {
         std::vector<float> out = Sentinels(s.scores_elems());
         *st = headsum_qk_scores(&a, in->q.data(), in->k.data(), out.data());
         return out;
       }},
      {"softmax_v",
       [=](headsum_status* st) {
         std::vector<float> out = Sentinels(s.out_elems());
         *st = headsum_softmax_v(&a, in->scores.data(), in->v.data(), out.data());
         return out;
       }},
      {"attention",
       [=](headsum_status* st) {
         std::vector<float> out = Sentinels(s.out_elems());
         *st = headsum_attention(&a, in->q.data(), in->k.data(), in->v.data(), out.data());
         return out;
       }},
      {"project_heads_sum",
       [=](headsum_status* st) {
         std::vector<float> y = Sentinels(s.y_elems());
         *st = headsum_project_heads_sum(&p, in->heads.data(), in->wo.data(), in->bias.data(),
                                         y.data());
         return y;
       }},
      {"project_heads_sum_ex",
       [=](headsum_status* st) {
         std::vector<float> y = Sentinels(s.y_elems() + s.per_head_elems());
         *st = headsum_project_heads_sum_ex(&p, in->heads.data(), in->wo.data(),
                                            in->bias.data(), in->gates.data(), y.data(),
                                            y.data() + s.y_elems());
         return y;
       }},
      {"project_heads_sum_ex(y only)",
       [=](headsum_status* st) {
         std::vector<float> y = Sentinels(s.y_elems());
         *st = headsum_project_heads_sum_ex(&p, in->heads.data(), in->wo.data(),
                                            in->bias.data(), in->gates.data(), y.data(), nullptr);
         return y;
       }},
      {"head_attribution",
       [=](headsum_status* st) {
         std::vector<float> out = Sentinels(rows * R);
         *st = headsum_head_attribution(&p, in->heads.data(), in->wo.data(), in->dirs.data(), R,
                                        out.data());
         return out;
       }},
      {"head_contribution_norms",
       [=](headsum_status* st) {
         std::vector<float> out = Sentinels(rows);
         *st = headsum_head_contribution_norms(&p, in->heads.data(), in->wo.data(), out.data());
         return out;
       }},
  };
}

class Determinism : public TargetTest {
 protected:
  void TearDown() override {
    EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
    TargetTest::TearDown();
  }
};

TEST_P(Determinism, BitwiseIdenticalFor1_2_8ThreadsAndRepeatedRuns) {
  const std::vector<MhaShape> shapes = DeterminismShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    for (const KernelRun& kernel : AllKernels(s, n)) {
      SCOPED_TRACE(kernel.name + " at " + s.name());
      ASSERT_EQ(headsum_set_num_threads(1), HEADSUM_OK);
      headsum_status st;
      const std::vector<float> first = kernel.run(&st);
      ASSERT_EQ(st, HEADSUM_OK) << StatusName(st) << ": " << headsum_last_error();
      const Layout flat{{int64_t(first.size())}, "n"};
      for (const int threads : {1, 2, 8}) {
        ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
        for (int repeat = 0; repeat < 2; ++repeat) {
          const std::vector<float> again = kernel.run(&st);
          ASSERT_EQ(st, HEADSUM_OK) << StatusName(st) << ": " << headsum_last_error();
          EXPECT_TRUE(BitwiseEqual(first, again, flat))
              << threads << " threads (repeat " << repeat << ") vs 1 thread";
        }
      }
    }
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(Determinism);

}  // namespace
}  // namespace headsum_test
