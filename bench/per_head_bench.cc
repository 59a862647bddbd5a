// Per-head contributions at kernel speed: what the additive view buys.
//
//   BM_attribution/headsum    headsum_head_attribution (R directions): O_h .
//                             (Wo[h] d_r), no [B][S][H][D] tensor anywhere
//   BM_attribution/basis      the same through a precomputed
//                             headsum_attribution_basis (weights fixed)
//   BM_attribution/materialize  what tools do today: every contribution
//                             O_h Wo[h] written out ([B][S][H][D], here by
//                             headsum_project_heads_sum_ex), then dotted
//                             with each direction
//   BM_project/plain          headsum_project_heads_sum
//   BM_project/per_head       headsum_project_heads_sum_ex writing y and
//                             every contribution: the price of per_head
//
// Shapes: B=1, H=8, L=64, D=512, S in {128, 512}; threads 1 and 2.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "headsum/headsum.h"

namespace {

constexpr int64_t kHeads = 8, kHeadDim = 64, kModel = 512;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Inputs {
  headsum_proj_shape shape;
  std::vector<float> heads, wo, bias, directions;
  int64_t R;
  explicit Inputs(int64_t seq, int64_t r)
      : shape{1, seq, kHeads, kHeadDim, kModel},
        heads(Random(static_cast<size_t>(seq * kHeads * kHeadDim), 1)),
        wo(Random(static_cast<size_t>(kHeads * kHeadDim * kModel), 2)),
        bias(Random(kModel, 3)),
        directions(Random(static_cast<size_t>(r * kModel), 4)),
        R(r) {}
};

void Check(benchmark::State& state, headsum_status s) {
  if (s != HEADSUM_OK) state.SkipWithError(headsum_last_error());
}

void SetCommon(benchmark::State& state, const Inputs& in, double flops) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["S"] = static_cast<double>(in.shape.seq);
}

void BM_AttributionHeadsum(benchmark::State& state) {
  Inputs in(state.range(0), state.range(1));
  headsum_set_num_threads(static_cast<int>(state.range(2)));
  std::vector<float> out(static_cast<size_t>(in.shape.seq * kHeads * in.R));
  for (auto _ : state) {
    Check(state, headsum_head_attribution(&in.shape, in.heads.data(), in.wo.data(),
                                          in.directions.data(), in.R, out.data()));
    benchmark::DoNotOptimize(out.data());
  }
  // Wo directions^T (H L D R) + O_h . basis (S H L R), 2 flops each.
  SetCommon(state, in, 2.0 * kHeads * kHeadDim * (kModel + in.shape.seq) * in.R);
}

void BM_AttributionBasis(benchmark::State& state) {
  Inputs in(state.range(0), state.range(1));
  headsum_set_num_threads(static_cast<int>(state.range(2)));
  headsum_attribution_basis* basis = nullptr;
  Check(state, headsum_attribution_basis_create(&in.shape, in.wo.data(), in.directions.data(),
                                                in.R, &basis));
  std::vector<float> out(static_cast<size_t>(in.shape.seq * kHeads * in.R));
  for (auto _ : state) {
    Check(state, headsum_head_attribution_basis(&in.shape, in.heads.data(), basis, out.data()));
    benchmark::DoNotOptimize(out.data());
  }
  headsum_attribution_basis_free(basis);
  SetCommon(state, in, 2.0 * kHeads * kHeadDim * in.shape.seq * in.R);
}

void BM_AttributionMaterialize(benchmark::State& state) {
  Inputs in(state.range(0), state.range(1));
  headsum_set_num_threads(static_cast<int>(state.range(2)));
  const size_t S = static_cast<size_t>(in.shape.seq), D = kModel, R = static_cast<size_t>(in.R);
  std::vector<float> per_head(S * kHeads * D), out(S * kHeads * R);
  for (auto _ : state) {
    Check(state, headsum_project_heads_sum_ex(&in.shape, in.heads.data(), in.wo.data(), nullptr,
                                              nullptr, nullptr, per_head.data()));
    // out[s][h][r] = per_head[s][h][:] . directions[r]
    for (size_t sh = 0; sh < S * kHeads; ++sh) {
      for (size_t r = 0; r < R; ++r) {
        const float* c = per_head.data() + sh * D;
        const float* d = in.directions.data() + r * D;
        float dot = 0.0f;
        for (size_t i = 0; i < D; ++i) dot += c[i] * d[i];
        out[sh * R + r] = dot;
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetCommon(state, in, 2.0 * S * kHeads * D * (kHeadDim + R));
}

void BM_ProjectPlain(benchmark::State& state) {
  Inputs in(state.range(0), 1);
  headsum_set_num_threads(static_cast<int>(state.range(2)));
  std::vector<float> y(static_cast<size_t>(in.shape.seq * kModel));
  for (auto _ : state) {
    Check(state, headsum_project_heads_sum(&in.shape, in.heads.data(), in.wo.data(),
                                           in.bias.data(), y.data()));
    benchmark::DoNotOptimize(y.data());
  }
  SetCommon(state, in, 2.0 * in.shape.seq * kHeads * kHeadDim * kModel);
}

void BM_ProjectPerHead(benchmark::State& state) {
  Inputs in(state.range(0), 1);
  headsum_set_num_threads(static_cast<int>(state.range(2)));
  std::vector<float> y(static_cast<size_t>(in.shape.seq * kModel)),
      per_head(static_cast<size_t>(in.shape.seq * kHeads * kModel));
  for (auto _ : state) {
    Check(state, headsum_project_heads_sum_ex(&in.shape, in.heads.data(), in.wo.data(),
                                              in.bias.data(), nullptr, y.data(),
                                              per_head.data()));
    benchmark::DoNotOptimize(per_head.data());
  }
  SetCommon(state, in, 2.0 * in.shape.seq * kHeads * kHeadDim * kModel);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 2})
    for (int64_t seq : {128, 512}) b->Args({seq, 1, threads});
  b->ArgNames({"S", "R", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_AttributionHeadsum)->Apply(Args);
BENCHMARK(BM_AttributionBasis)->Apply(Args);
BENCHMARK(BM_AttributionMaterialize)->Apply(Args);
BENCHMARK(BM_ProjectPlain)->Apply(Args);
BENCHMARK(BM_ProjectPerHead)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
