// headsum_bf16_bench: the native bf16 paths beside their oneDNN bf16 twins,
// and beside headsum's own f32 attention, at 1 and 2 threads; then a table
// of medians and ratios (twin time / headsum time: > 1 means headsum is
// faster), each native row also as a share of its instruction's measured
// single-core peak (bench/peak_bf16.cc) times the threads.
//
//   bf16_attention   H=8, L=64, S=Sq=Skv in {20, 512, 2048}, causal and not;
//                    decode Sq=1 Skv=4096 (MHA, and GQA Hkv=2).  headsum:
//                    headsum_attention_tensors on bf16 q/k/v/out with the
//                    native path in force; oneDNN: bf16 matmul, softmax
//                    (f32 in, bf16 P out), bf16 matmul.  Flops: 4 B H Sq
//                    Skv L (masked entries counted, as for oneDNN).
//   bf16_projection  B=1, H=8, L=64, D=512, S in {20, 128, 512, 2048}:
//                    headsum packed Wo (headsum_wo_pack_tensor once) and
//                    plain (Wo packed per call) vs concat + one oneDNN bf16
//                    matmul.  Flops: 2 B S H L D.
//   attention_f32    headsum's f32 attention (Highway) at S=2048, the
//                    baseline of "bf16 over f32".
//
// Run: OMP_PROC_BIND=true OMP_PLACES=cores build/bench/headsum_bf16_bench
// (defaults: --benchmark_repetitions=5 --benchmark_min_time=0.2).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/peak_bf16.h"
#include "headsum/headsum.h"
#include "kernels/native/native.h"
#include "kernels/shapes.h"

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
#include "kernels/onednn/onednn_ref.h"
#endif

namespace headsum {
namespace bench {
namespace {

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed, float amplitude) {
  std::vector<uint16_t> out(n);
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float unit = float(state >> 8) * (1.0f / 16777216.0f);
    out[i] = native::F32ToBf16((2.0f * unit - 1.0f) * amplitude);
  }
  return out;
}
std::vector<float> Widen(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = native::Bf16ToF32(b[i]);
  return f;
}

std::map<std::string, std::string> g_impls;  // oneDNN implementations per case

struct AttnCase {
  int64_t hkv, sq, skv;
  bool causal;
};

headsum_attn_shape AttnShape(const AttnCase& c) {
  return headsum_attn_shape{1, 8, c.hkv, c.sq, c.skv, 64, 0.0f, c.causal ? 1 : 0};
}
std::string AttnLabel(const AttnCase& c) {
  return "H:8/Hkv:" + std::to_string(c.hkv) + "/Sq:" + std::to_string(c.sq) + "/Skv:" +
         std::to_string(c.skv) + "/L:64/causal:" + std::to_string(c.causal ? 1 : 0);
}
double AttnFlops(const AttnCase& c) { return 4.0 * 8 * double(c.sq) * double(c.skv) * 64; }

void SetFlops(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BfAttention(benchmark::State& state, AttnCase c, int threads, bool onednn) {
  const headsum_attn_shape s = AttnShape(c);
  const size_t nq = size_t(8 * c.sq * 64), nkv = size_t(c.hkv * c.skv * 64);
  std::vector<uint16_t> q = RandomBf16(nq, 1, 1.5f), k = RandomBf16(nkv, 2, 1.5f),
                        v = RandomBf16(nkv, 3, 1.0f), o(nq);
  if (onednn) {
#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
    AttnDims a{1, 8, size_t(c.hkv), size_t(c.sq), size_t(c.skv), 64, 0.125f, c.causal};
    std::string impls;
    if (onednn::AttentionBf16(a, q.data(), k.data(), v.data(), o.data(), threads, &impls) != HEADSUM_OK) {
      state.SkipWithError("oneDNN bf16 attention unsupported");
      return;
    }
    g_impls[AttnLabel(c) + "/threads:" + std::to_string(threads)] = impls;
    for (auto _ : state) onednn::AttentionBf16(a, q.data(), k.data(), v.data(), o.data(), threads, nullptr);
#else
    state.SkipWithError("built without oneDNN");
    return;
#endif
  } else {
    headsum_set_num_threads(threads);
    headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_BF16, 8, c.sq, 64);
    headsum_tensor tk = headsum_bhsd(k.data(), HEADSUM_BF16, c.hkv, c.skv, 64);
    headsum_tensor tv = headsum_bhsd(v.data(), HEADSUM_BF16, c.hkv, c.skv, 64);
    headsum_tensor to = headsum_bhsd(o.data(), HEADSUM_BF16, 8, c.sq, 64);
    if (headsum_attention_tensors(&s, &tq, &tk, &tv, &to) != HEADSUM_OK) {
      state.SkipWithError(headsum_last_error());
      return;
    }
    for (auto _ : state) headsum_attention_tensors(&s, &tq, &tk, &tv, &to);
    headsum_set_num_threads(0);
  }
  SetFlops(state, AttnFlops(c));
}

void F32Attention(benchmark::State& state, AttnCase c, int threads) {
  const headsum_attn_shape s = AttnShape(c);
  const size_t nq = size_t(8 * c.sq * 64), nkv = size_t(c.hkv * c.skv * 64);
  std::vector<float> q = Widen(RandomBf16(nq, 1, 1.5f)), k = Widen(RandomBf16(nkv, 2, 1.5f)),
                     v = Widen(RandomBf16(nkv, 3, 1.0f)), o(nq);
  headsum_set_num_threads(threads);
  for (auto _ : state) headsum_attention(&s, q.data(), k.data(), v.data(), o.data());
  headsum_set_num_threads(0);
  SetFlops(state, AttnFlops(c));
}

enum class ProjImpl { kPacked, kPlain, kOnednn };

void BfProjection(benchmark::State& state, int64_t seq, int threads, ProjImpl impl) {
  const headsum_proj_shape p{1, seq, 8, 64, 512};
  std::vector<uint16_t> o = RandomBf16(size_t(8 * seq * 64), 4, 1.0f),
                        wo = RandomBf16(size_t(512 * 512), 5, 0.05f);
  std::vector<float> bias(512, 0.25f), y(size_t(seq * 512));
  if (impl == ProjImpl::kOnednn) {
#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
    ProjDims d{1, size_t(seq), 8, 64, 512};
    std::string impls;
    if (onednn::ConcatProjectBf16(d, o.data(), wo.data(), bias.data(), y.data(), threads, &impls) != HEADSUM_OK) {
      state.SkipWithError("oneDNN bf16 matmul unsupported");
      return;
    }
    g_impls["projection/S:" + std::to_string(seq) + "/threads:" + std::to_string(threads)] = impls;
    for (auto _ : state) onednn::ConcatProjectBf16(d, o.data(), wo.data(), bias.data(), y.data(), threads, nullptr);
#else
    state.SkipWithError("built without oneDNN");
    return;
#endif
  } else {
    headsum_set_num_threads(threads);
    headsum_tensor th = headsum_bhsd(o.data(), HEADSUM_BF16, 8, seq, 64);
    headsum_tensor tw = {wo.data(), HEADSUM_BF16, {0, 0, 512}};
    headsum_tensor ty = {y.data(), HEADSUM_F32, {seq * 512, 0, 512}};
    if (impl == ProjImpl::kPacked) {
      headsum_wo_packed* packed = nullptr;
      if (headsum_wo_pack_tensor(&p, &tw, &packed) != HEADSUM_OK) {
        state.SkipWithError(headsum_last_error());
        return;
      }
      for (auto _ : state) headsum_project_heads_sum_packed_tensors(&p, &th, packed, bias.data(), &ty);
      headsum_wo_free(packed);
    } else {
      for (auto _ : state) headsum_project_heads_sum_tensors(&p, &th, &tw, bias.data(), &ty);
    }
    headsum_set_num_threads(0);
  }
  SetFlops(state, 2.0 * double(seq) * 8 * 64 * 512);
}

// Collects the medians for the table printed at the end.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.aggregate_name == "median" || (r.run_type == Run::RT_Iteration && r.repetitions <= 1)) {
        const std::string name = r.run_name.function_name;
        medians[name] = r.GetAdjustedRealTime();
        auto it = r.counters.find("GFLOP/s");
        if (it != r.counters.end()) gflops[name] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> medians, gflops;
};

}  // namespace
}  // namespace bench
}  // namespace headsum

int main(int argc, char** argv) {
  using namespace headsum::bench;
  std::vector<char*> args(argv, argv + argc);
  const bool has_reps = HasFlag(argc, argv, "--benchmark_repetitions");
  const bool has_min = HasFlag(argc, argv, "--benchmark_min_time");
  static char reps[] = "--benchmark_repetitions=5", aggr[] = "--benchmark_report_aggregates_only=true",
              mint[] = "--benchmark_min_time=0.2";
  if (!has_reps) {
    args.push_back(reps);
    args.push_back(aggr);
  }
  if (!has_min) args.push_back(mint);
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());

  const double vdp = VdpBf16PeakGflops(), tdp = TdpBf16PeakGflops();
  const std::string target = headsum_active_target();
  std::printf("native path in force: %s; single-core peaks: VDPBF16PS %.0f GFLOP/s, TDPBF16PS %s\n",
              target.c_str(), vdp, tdp > 0 ? std::to_string(int(tdp)).c_str() : "n/a (no AMX)");
  const double peak = target == "AMX_BF16" ? tdp : vdp;

  const std::vector<AttnCase> attn = {{8, 20, 20, false},   {8, 20, 20, true},   {8, 512, 512, false},
                                      {8, 512, 512, true},  {8, 2048, 2048, false}, {8, 2048, 2048, true},
                                      {8, 1, 4096, false},  {2, 1, 4096, false}};
  const int threads_list[] = {1, 2};
  for (int t : threads_list) {
    for (const AttnCase& c : attn) {
      for (bool onednn : {false, true}) {
        const std::string name = std::string("bf16_attention/") + (onednn ? "onednn/" : "headsum/") +
                                 AttnLabel(c) + "/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), [c, t, onednn](benchmark::State& s) {
          BfAttention(s, c, t, onednn);
        })->UseRealTime();
      }
    }
    for (const AttnCase& c : {AttnCase{8, 2048, 2048, false}, AttnCase{8, 2048, 2048, true}}) {
      const std::string name = "attention_f32/headsum/" + AttnLabel(c) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), [c, t](benchmark::State& s) { F32Attention(s, c, t); })
          ->UseRealTime();
    }
    for (int64_t seq : {20, 128, 512, 2048}) {
      for (ProjImpl impl : {ProjImpl::kPacked, ProjImpl::kPlain, ProjImpl::kOnednn}) {
        const char* in = impl == ProjImpl::kPacked ? "headsum_packed" : impl == ProjImpl::kPlain ? "headsum_plain" : "onednn";
        const std::string name = std::string("bf16_projection/") + in + "/S:" + std::to_string(seq) +
                                 "/H:8/L:64/D:512/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), [seq, t, impl](benchmark::State& s) {
          BfProjection(s, seq, t, impl);
        })->UseRealTime();
      }
    }
  }
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  // The table: headsum vs its twin, share of peak.
  const auto median = [&](const std::string& name) {
    auto it = reporter.medians.find(name);
    return it == reporter.medians.end() ? 0.0 : it->second;
  };
  const auto gf = [&](const std::string& name) {
    auto it = reporter.gflops.find(name);
    return it == reporter.gflops.end() ? 0.0 : it->second;
  };
  std::printf("\n%-62s %9s %9s %7s %8s\n", "case (median of repetitions)", "headsum", "twin", "ratio", "pct_peak");
  std::printf("%-62s %9s %9s %7s %8s\n", "", "GFLOP/s", "GFLOP/s", "", "");
  for (int t : threads_list) {
    const std::string ts = "/threads:" + std::to_string(t);
    for (const AttnCase& c : attn) {
      const std::string h = "bf16_attention/headsum/" + AttnLabel(c) + ts, o = "bf16_attention/onednn/" + AttnLabel(c) + ts;
      const double th = median(h), to = median(o);
      std::printf("%-62s %9.1f %9.1f %7.2f %7.1f%%\n", ("attn bf16 vs oneDNN " + AttnLabel(c) + ts).c_str(), gf(h), gf(o),
                  th > 0 && to > 0 ? to / th : 0.0, peak > 0 ? 100 * gf(h) / (peak * t) : 0.0);
    }
    for (const AttnCase& c : {AttnCase{8, 2048, 2048, false}, AttnCase{8, 2048, 2048, true}}) {
      const std::string h = "bf16_attention/headsum/" + AttnLabel(c) + ts, f = "attention_f32/headsum/" + AttnLabel(c) + ts;
      const double th = median(h), tf = median(f);
      std::printf("%-62s %9.1f %9.1f %7.2f\n", ("attn bf16 vs headsum f32 " + AttnLabel(c) + ts).c_str(), gf(h), gf(f),
                  th > 0 && tf > 0 ? tf / th : 0.0);
    }
    for (int64_t seq : {20, 128, 512, 2048}) {
      const std::string sfx = "/S:" + std::to_string(seq) + "/H:8/L:64/D:512" + ts;
      const std::string o = "bf16_projection/onednn" + sfx;
      for (const char* in : {"headsum_packed", "headsum_plain"}) {
        const std::string h = std::string("bf16_projection/") + in + sfx;
        const double th = median(h), to = median(o);
        std::printf("%-62s %9.1f %9.1f %7.2f %7.1f%%\n", (std::string("proj bf16 ") + in + " vs oneDNN" + sfx).c_str(),
                    gf(h), gf(o), th > 0 && to > 0 ? to / th : 0.0, peak > 0 ? 100 * gf(h) / (peak * t) : 0.0);
      }
    }
  }
  std::printf("\nscaling, 2 threads over 1 (headsum bf16):\n");
  for (const AttnCase& c : attn) {
    if (c.sq < 512) continue;
    const double t1 = median("bf16_attention/headsum/" + AttnLabel(c) + "/threads:1"),
                 t2 = median("bf16_attention/headsum/" + AttnLabel(c) + "/threads:2");
    std::printf("  attention %-50s %.2fx\n", AttnLabel(c).c_str(), t1 > 0 && t2 > 0 ? t1 / t2 : 0.0);
  }
  for (int64_t seq : {512, 2048}) {
    const std::string sfx = "/S:" + std::to_string(seq) + "/H:8/L:64/D:512";
    const double t1 = median("bf16_projection/headsum_packed" + sfx + "/threads:1"),
                 t2 = median("bf16_projection/headsum_packed" + sfx + "/threads:2");
    std::printf("  projection packed %-42s %.2fx\n", sfx.c_str(), t1 > 0 && t2 > 0 ? t1 / t2 : 0.0);
  }
  std::printf("\noneDNN implementations:\n");
  for (const auto& kv : g_impls) std::printf("  %s: %s\n", kv.first.c_str(), kv.second.c_str());
  benchmark::Shutdown();
  return 0;
}
