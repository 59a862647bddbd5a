// headsum_bench: every kernel beside its oneDNN twin, on the shapes of
// bench_shapes.h, at 1 and 2 threads.
//
// Names are '/'-separated, key:value after the kernel and implementation, so
// scripts/bench_table.py can pair twins by swapping the second field:
//   BM_attention/headsum/B:1/H:8/Hkv:8/Sq:512/Skv:512/L:64/causal:1/threads:2
//   BM_attention/onednn/B:1/H:8/Hkv:8/Sq:512/Skv:512/L:64/causal:1/threads:2
//   BM_project_heads_sum/headsum/B:1/S:20/H:8/L:64/D:512/threads:1
// (Google Benchmark appends /real_time: the kernels run on several threads,
// so wall time is what counts.)
//
// Counters, from the wall time of the timed loop:
//   GFLOP/s          the full flop count of the shape (2 per multiply-add;
//                    causal counts masked entries too, so headsum and oneDNN
//                    are compared on the same work)
//   visible_GFLOP/s  causal only: the flops of the unmasked entries
//   pct_peak         GFLOP/s as a share of threads x the measured single-core
//                    FMA peak (context: peak_gflops_per_core)
//
// Unless given on the command line, runs --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true: read the _median rows.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench/bench_shapes.h"
#include "bench/peak.h"
#include "headsum/headsum.h"
#include "kernels/shapes.h"

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
#include "kernels/onednn/onednn_ref.h"
#endif

namespace headsum {
namespace bench {
namespace {

// ---------------------------------------------------------------------------
// Buffers: 64-byte aligned, filled with a fixed pseudo-random sequence.

class Floats {
 public:
  Floats() = default;
  explicit Floats(size_t count) : count_(count) {
    const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64)));
    if (!data_) throw std::bad_alloc();
  }
  float* data() const { return data_.get(); }
  size_t size() const { return count_; }

  // Uniform in [-amplitude, amplitude]; a 32-bit LCG is plenty for timing.
  void FillRandom(uint32_t seed, float amplitude) {
    uint32_t state = seed * 2654435761u + 1;
    for (size_t i = 0; i < count_; ++i) {
      state = state * 1664525u + 1013904223u;
      const float unit = static_cast<float>(state >> 8) * (1.0f / 16777216.0f);  // [0, 1)
      data_[i] = (2.0f * unit - 1.0f) * amplitude;
    }
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t count_ = 0;
};

// ---------------------------------------------------------------------------
// Kernels and their twins, behind one signature per family.

struct AttnBuffers {
  Floats q, k, v, scores, out;
};

using AttnCall = headsum_status (*)(const headsum_attn_shape*, AttnBuffers&);

struct AttnKernel {
  const char* name;
  double flops_per_mac;  // QK^T and PV: 2 per entry of S per l; attention does both: 4
  bool uses_qk;          // reads q, k
  bool uses_scores;      // reads or writes scores [B][H][Sq][Skv]
  bool uses_v;           // reads v, writes out
  AttnCall headsum, onednn;
};

const AttnKernel kAttnKernels[] = {
    {"qk_scores", 2.0, true, true, false,
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_qk_scores(s, b.q.data(), b.k.data(), b.scores.data());
     },
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_qk_scores_onednn(s, b.q.data(), b.k.data(), b.scores.data());
     }},
    {"softmax_v", 2.0, false, true, true,
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_softmax_v(s, b.scores.data(), b.v.data(), b.out.data());
     },
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_softmax_v_onednn(s, b.scores.data(), b.v.data(), b.out.data());
     }},
    {"attention", 4.0, true, false, true,
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_attention(s, b.q.data(), b.k.data(), b.v.data(), b.out.data());
     },
     [](const headsum_attn_shape* s, AttnBuffers& b) {
       return headsum_attention_onednn(s, b.q.data(), b.k.data(), b.v.data(), b.out.data());
     }},
};

struct ProjBuffers {
  Floats heads, wo, bias, y;
  headsum_wo_packed* packed_wo = nullptr;  // packed once, outside the timed loop
  ~ProjBuffers() { headsum_wo_free(packed_wo); }
};

using ProjCall = headsum_status (*)(const headsum_proj_shape*, ProjBuffers&);

const ProjCall kProjectHeadsum = [](const headsum_proj_shape* s, ProjBuffers& b) {
  return headsum_project_heads_sum(s, b.heads.data(), b.wo.data(), b.bias.data(), b.y.data());
};
const ProjCall kProjectPacked = [](const headsum_proj_shape* s, ProjBuffers& b) {
  return headsum_project_heads_sum_packed(s, b.heads.data(), b.packed_wo, b.bias.data(),
                                          b.y.data());
};
const ProjCall kProjectOnednn = [](const headsum_proj_shape* s, ProjBuffers& b) {
  return headsum_concat_project_onednn(s, b.heads.data(), b.wo.data(), b.bias.data(), b.y.data());
};

// ---------------------------------------------------------------------------
// Flop counts.

// The public shape with defaults resolved, as dispatch resolves them.
AttnDims Resolve(const headsum_attn_shape& s) {
  const int64_t kv_heads = s.kv_heads == 0 ? s.heads : s.kv_heads;
  const float scale = s.scale != 0.0f
                          ? s.scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  return AttnDims{static_cast<size_t>(s.batch),
                  static_cast<size_t>(s.heads),
                  static_cast<size_t>(kv_heads),
                  static_cast<size_t>(s.seq_q),
                  static_cast<size_t>(s.seq_kv),
                  static_cast<size_t>(s.head_dim),
                  scale,
                  s.causal != 0};
}

// Entries of S per (batch, head): all of them, and those the mask leaves.
double AllEntries(const AttnDims& a) { return static_cast<double>(a.seq_q * a.seq_kv); }
double VisibleEntries(const AttnDims& a) {
  double n = 0;
  for (size_t i = 0; i < a.seq_q; ++i) n += static_cast<double>(a.visible_keys(i));
  return n;
}

double g_peak_gflops_per_core = 0.0;

// Wall time of the timed loop.  The counters are derived from it here rather
// than as Google Benchmark rate counters so that pct_peak prints as a plain
// percentage (a rate counter would print "87.4/s").
class LoopTimer {
 public:
  LoopTimer() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Sets GFLOP/s, visible_GFLOP/s (causal) and pct_peak from the flops of one
// iteration and the loop's wall time.
void SetFlopCounters(benchmark::State& state, double seconds, double flops, double visible_flops,
                     bool report_visible, int threads) {
  if (state.error_occurred() || seconds <= 0 || state.iterations() == 0) return;
  const double per_second = static_cast<double>(state.iterations()) / seconds;
  const double gflops = flops * per_second * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  if (report_visible) state.counters["visible_GFLOP/s"] = visible_flops * per_second * 1e-9;
  if (g_peak_gflops_per_core > 0) {
    state.counters["pct_peak"] = 100.0 * gflops / (g_peak_gflops_per_core * threads);
  }
}

std::string StatusMessage(const char* what, headsum_status status) {
  return std::string(what) + " returned status " + std::to_string(static_cast<int>(status)) + ": " +
         headsum_last_error();
}

bool SetThreads(benchmark::State& state, int threads) {
  const headsum_status status = headsum_set_num_threads(threads);
  if (status != HEADSUM_OK) {
    state.SkipWithError(StatusMessage("headsum_set_num_threads", status).c_str());
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Benchmark bodies.

void RunAttn(benchmark::State& state, const AttnKernel& kernel, bool onednn,
             headsum_attn_shape shape, int threads) {
  if (!SetThreads(state, threads)) return;
  const AttnDims a = Resolve(shape);
  AttnBuffers buffers;
  const size_t q_count = a.batch * a.heads * a.seq_q * a.head_dim;
  const size_t kv_count = a.batch * a.kv_heads * a.seq_kv * a.head_dim;
  const size_t s_count = a.batch * a.heads * a.seq_q * a.seq_kv;
  if (kernel.uses_qk) {
    buffers.q = Floats(q_count);
    buffers.q.FillRandom(1, 1.0f);
    buffers.k = Floats(kv_count);
    buffers.k.FillRandom(2, 1.0f);
  }
  if (kernel.uses_v) {
    buffers.v = Floats(kv_count);
    buffers.v.FillRandom(3, 1.0f);
    buffers.out = Floats(q_count);
  }
  if (kernel.uses_scores) {
    buffers.scores = Floats(s_count);
    buffers.scores.FillRandom(4, 3.0f);  // the spread of scaled dot products
  }
  const AttnCall call = onednn ? kernel.onednn : kernel.headsum;
  const char* what = onednn ? "oneDNN twin" : "headsum kernel";

  // One untimed call: checks the status, builds oneDNN's primitives and
  // mask, and faults in the output pages.
  headsum_status status = call(&shape, buffers);
  if (status != HEADSUM_OK) {
    state.SkipWithError(StatusMessage(what, status).c_str());
    return;
  }
  const LoopTimer timer;
  for (auto _ : state) {
    status = call(&shape, buffers);
    if (status != HEADSUM_OK) {
      state.SkipWithError(StatusMessage(what, status).c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  const double per_entry = kernel.flops_per_mac * static_cast<double>(a.batch * a.heads) *
                           static_cast<double>(a.head_dim);
  SetFlopCounters(state, timer.Seconds(), per_entry * AllEntries(a), per_entry * VisibleEntries(a),
                  a.causal, threads);
}

// How the projection is called: headsum with Wo as given, headsum with Wo
// packed beforehand (headsum_wo_pack, once per weight), or oneDNN.
enum class ProjImpl { kHeadsum, kPacked, kOnednn };

void RunProject(benchmark::State& state, ProjImpl impl, headsum_proj_shape shape, int threads) {
  if (!SetThreads(state, threads)) return;
  const size_t b = static_cast<size_t>(shape.batch), s = static_cast<size_t>(shape.seq);
  const size_t inner = static_cast<size_t>(shape.heads * shape.head_dim);
  const size_t d = static_cast<size_t>(shape.model_dim);
  ProjBuffers buffers;
  buffers.heads = Floats(b * s * inner);
  buffers.heads.FillRandom(5, 1.0f);
  buffers.wo = Floats(inner * d);
  buffers.wo.FillRandom(6, 0.05f);
  buffers.bias = Floats(d);
  buffers.bias.FillRandom(7, 0.1f);
  buffers.y = Floats(b * s * d);
  const bool onednn = impl == ProjImpl::kOnednn;
  const ProjCall call = onednn                       ? kProjectOnednn
                        : impl == ProjImpl::kPacked ? kProjectPacked
                                                    : kProjectHeadsum;
  const char* what = onednn ? "oneDNN twin" : "headsum kernel";
  if (impl == ProjImpl::kPacked &&
      headsum_wo_pack(&shape, buffers.wo.data(), &buffers.packed_wo) != HEADSUM_OK) {
    state.SkipWithError((std::string("headsum_wo_pack: ") + headsum_last_error()).c_str());
    return;
  }

  headsum_status status = call(&shape, buffers);
  if (status != HEADSUM_OK) {
    state.SkipWithError(StatusMessage(what, status).c_str());
    return;
  }
  const LoopTimer timer;
  for (auto _ : state) {
    status = call(&shape, buffers);
    if (status != HEADSUM_OK) {
      state.SkipWithError(StatusMessage(what, status).c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(b * s * inner * d);
  SetFlopCounters(state, timer.Seconds(), flops, flops, false, threads);
}

// ---------------------------------------------------------------------------
// Registration: headsum and its twin next to each other.

const char* ImplName(bool onednn) { return onednn ? "onednn" : "headsum"; }

std::string AttnName(const AttnKernel& kernel, bool onednn, const headsum_attn_shape& s,
                     int threads) {
  return std::string("BM_") + kernel.name + "/" + ImplName(onednn) +
         "/B:" + std::to_string(s.batch) + "/H:" + std::to_string(s.heads) +
         "/Hkv:" + std::to_string(s.kv_heads) + "/Sq:" + std::to_string(s.seq_q) +
         "/Skv:" + std::to_string(s.seq_kv) + "/L:" + std::to_string(s.head_dim) +
         "/causal:" + std::to_string(s.causal) + "/threads:" + std::to_string(threads);
}

std::string ProjName(ProjImpl impl, const headsum_proj_shape& s, int threads) {
  const std::string kernel =
      impl == ProjImpl::kPacked ? "BM_project_heads_sum_packed/" : "BM_project_heads_sum/";
  return kernel + ImplName(impl == ProjImpl::kOnednn) + "/B:" + std::to_string(s.batch) +
         "/S:" + std::to_string(s.seq) + "/H:" + std::to_string(s.heads) +
         "/L:" + std::to_string(s.head_dim) + "/D:" + std::to_string(s.model_dim) +
         "/threads:" + std::to_string(threads);
}

headsum_attn_shape AttnShape(int64_t seq_q, int64_t seq_kv, bool causal) {
  return SeedAt(seq_q, seq_kv, causal).attn(/*scale=*/0.0f);  // 0: 1/sqrt(L)
}

void RegisterAttnPair(const AttnKernel& kernel, const headsum_attn_shape& shape, int threads) {
  for (const bool onednn : {false, true}) {
    benchmark::RegisterBenchmark(AttnName(kernel, onednn, shape, threads).c_str(),
                                 [&kernel, onednn, shape, threads](benchmark::State& state) {
                                   RunAttn(state, kernel, onednn, shape, threads);
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

// The same kernels forced onto lower targets: no target may stay a naive
// loop.  BM_<kernel>/at_<TARGET>/..., pct_peak against that target's own
// measured peak (its context key peak_gflops_<TARGET>).
void RegisterLowerTargets() {
  static const char* const kTargets[] = {"AVX2", "SSE4"};
  for (const char* target : kTargets) {
    const double peak = MeasureTargetPeak(target);
    if (peak <= 0) continue;
    benchmark::AddCustomContext(std::string("peak_gflops_") + target, std::to_string(peak));
    for (const AttnKernel& kernel : kAttnKernels) {
      if (std::strcmp(kernel.name, "attention") != 0) continue;
      for (const bool causal : {false, true}) {
        const headsum_attn_shape shape = AttnShape(512, 512, causal);
        std::string name = AttnName(kernel, false, shape, 1);
        name.replace(name.find("/headsum/"), 9, std::string("/at_") + target + "/");
        benchmark::RegisterBenchmark(name.c_str(),
                                     [&kernel, shape, target, peak](benchmark::State& state) {
                                       if (headsum_set_target(target) != HEADSUM_OK) {
                                         state.SkipWithError(headsum_last_error());
                                         return;
                                       }
                                       const double best = g_peak_gflops_per_core;
                                       g_peak_gflops_per_core = peak;
                                       RunAttn(state, kernel, false, shape, 1);
                                       g_peak_gflops_per_core = best;
                                       headsum_set_target(nullptr);
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
    {
      const headsum_proj_shape shape = SeedAt(512, 512, false).proj();
      std::string name = ProjName(ProjImpl::kHeadsum, shape, 1);
      name.replace(name.find("/headsum/"), 9, std::string("/at_") + target + "/");
      benchmark::RegisterBenchmark(name.c_str(), [shape, target, peak](benchmark::State& state) {
        if (headsum_set_target(target) != HEADSUM_OK) {
          state.SkipWithError(headsum_last_error());
          return;
        }
        const double best = g_peak_gflops_per_core;
        g_peak_gflops_per_core = peak;
        RunProject(state, ProjImpl::kHeadsum, shape, 1);
        g_peak_gflops_per_core = best;
        headsum_set_target(nullptr);
      })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

void RegisterAll() {
  for (const AttnKernel& kernel : kAttnKernels) {
    for (const int64_t seq : kSeqLens) {
      for (const bool causal : {false, true}) {
        for (const int threads : kThreadCounts) {
          RegisterAttnPair(kernel, AttnShape(seq, seq, causal), threads);
        }
      }
    }
    if (std::strcmp(kernel.name, "attention") == 0) {
      for (const int threads : kThreadCounts) {
        RegisterAttnPair(kernel, AttnShape(kDecodeSeqQ, kDecodeSeqKv, true), threads);
      }
      for (const int threads : kThreadCounts) {
        headsum_attn_shape gqa = AttnShape(kDecodeSeqQ, kDecodeSeqKv, true);
        gqa.kv_heads = kDecodeGqaKvHeads;
        RegisterAttnPair(kernel, gqa, threads);
      }
    }
  }
  for (const int64_t seq : kSeqLens) {
    for (const int threads : kThreadCounts) {
      const headsum_proj_shape shape = SeedAt(seq, seq, false).proj();
      for (const ProjImpl impl : {ProjImpl::kHeadsum, ProjImpl::kOnednn, ProjImpl::kPacked}) {
        benchmark::RegisterBenchmark(ProjName(impl, shape, threads).c_str(),
                                     [impl, shape, threads](benchmark::State& state) {
                                       RunProject(state, impl, shape, threads);
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Context printed once above the results (and in the JSON "context").

void AddContext(const Peak& peak) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f", peak.gflops);
  benchmark::AddCustomContext("peak_gflops_per_core", text);
  benchmark::AddCustomContext("peak_probe_target", peak.target);
  benchmark::AddCustomContext("headsum_version", headsum_version());
  benchmark::AddCustomContext("headsum_target", headsum_active_target());
  const int n = headsum_compiled_targets(nullptr, 0);
  std::vector<const char*> names(static_cast<size_t>(n > 0 ? n : 0));
  headsum_compiled_targets(names.data(), n);
  std::string compiled;
  for (const char* name : names) compiled += (compiled.empty() ? "" : ",") + std::string(name);
  benchmark::AddCustomContext("headsum_compiled_targets", compiled);
  const char* bind = std::getenv("OMP_PROC_BIND");
  benchmark::AddCustomContext("OMP_PROC_BIND", bind != nullptr ? bind : "(unset)");
#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
  // Which oneDNN implementations the twins run; "ref:" would mean oneDNN's
  // slow reference fallback and an unfair comparison.
  const int64_t seq = 512;
  const headsum_attn_shape causal = AttnShape(seq, seq, true);
  const headsum_attn_shape decode = AttnShape(kDecodeSeqQ, kDecodeSeqKv, true);
  const headsum_proj_shape p = SeedAt(seq, seq, false).proj();
  const ProjDims proj{static_cast<size_t>(p.batch), static_cast<size_t>(p.seq),
                      static_cast<size_t>(p.heads), static_cast<size_t>(p.head_dim),
                      static_cast<size_t>(p.model_dim)};
  const AttnDims causal_dims = Resolve(causal), decode_dims = Resolve(decode);
  for (const int threads : kThreadCounts) {
    const std::string key = "onednn_impls_threads:" + std::to_string(threads);
    const std::string impls = onednn::DescribeImpls(causal_dims, proj, threads);
    benchmark::AddCustomContext(key + "_S:512_causal:1", impls);
    benchmark::AddCustomContext(key + "_decode", onednn::DescribeImpls(decode_dims, proj, threads));
    if (impls.find("ref:") != std::string::npos) {
      std::fprintf(stderr, "warning: oneDNN falls back to a reference implementation: %s\n",
                   impls.c_str());
    }
  }
#endif
}

bool HasFlag(int argc, char** argv, const char* flag) {
  const size_t len = std::strlen(flag);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, len) == 0) return true;
  }
  return false;
}

}  // namespace
}  // namespace bench
}  // namespace headsum

int main(int argc, char** argv) {
  using headsum::bench::HasFlag;
  // Medians of 5 repetitions unless the command line says otherwise.
  std::vector<char*> args(argv, argv + argc);
  static char repetitions[] = "--benchmark_repetitions=5";
  static char aggregates[] = "--benchmark_report_aggregates_only=true";
  if (!HasFlag(argc, argv, "--benchmark_repetitions")) args.push_back(repetitions);
  if (!HasFlag(argc, argv, "--benchmark_report_aggregates_only") &&
      !HasFlag(argc, argv, "--benchmark_display_aggregates_only")) {
    args.push_back(aggregates);
  }
  int args_count = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;

  const headsum::bench::Peak peak = headsum::bench::MeasureSingleCorePeak();
  headsum::bench::g_peak_gflops_per_core = peak.gflops;
  headsum::bench::AddContext(peak);
  headsum::bench::RegisterAll();
  headsum::bench::RegisterLowerTargets();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
