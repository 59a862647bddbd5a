// headsum_bench: every kernel beside its oneDNN twin, on the shapes of
// bench_shapes.h, at 1 and 2 threads.
//
// Names are '/'-separated, key:value after the kernel and implementation, so
// `scripts/bench.py kernels` can pair twins by swapping the second field:
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

#include <algorithm>
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
#include "bench/flags.h"
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
// Buffers: 64-byte aligned, or `offset_bytes` past a 64-byte boundary (16:
// what std::vector / glibc malloc gives), filled with a fixed pseudo-random
// sequence.  Both implementations of a pair get buffers at the same offset.

class Floats {
 public:
  Floats() = default;
  Floats(size_t count, size_t offset_bytes) : count_(count) {
    const size_t offset = offset_bytes / sizeof(float);
    const size_t bytes = ((count + offset) * sizeof(float) + 63) / 64 * 64;
    base_.reset(static_cast<float*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64)));
    if (!base_) throw std::bad_alloc();
    data_ = base_.get() + offset;
  }
  float* data() const { return data_; }
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
  std::unique_ptr<float[], Free> base_;
  float* data_ = nullptr;
  size_t count_ = 0;
};

// The buffer offsets every benchmark row runs at: 64-byte aligned (names as
// before) and 16 bytes off (names end in /off:16 before /threads:).
inline constexpr size_t kOffsets[] = {0, 16};

// Bytes the kernel would still find free: /proc/meminfo's MemAvailable
// (0 when unreadable, which disables the check).
double AvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024.0;
}

// Skips the row (saying why) when `bytes` more would not fit in memory.
bool FitsInMemory(benchmark::State& state, double bytes, const char* what) {
  const double available = AvailableBytes();
  if (available <= 0 || bytes + (512.0 * (1 << 20)) < available) return true;
  char text[256];
  std::snprintf(text, sizeof(text),
                "skipped: %s needs %.2f GiB, MemAvailable is %.2f GiB", what,
                bytes / (1 << 30), available / (1 << 30));
  state.SkipWithError(text);
  return false;
}

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
             headsum_attn_shape shape, int threads, size_t offset) {
  if (!SetThreads(state, threads)) return;
  const AttnDims a = Resolve(shape);
  AttnBuffers buffers;
  const size_t q_count = a.batch * a.heads * a.seq_q * a.head_dim;
  const size_t kv_count = a.batch * a.kv_heads * a.seq_kv * a.head_dim;
  const size_t s_count = a.batch * a.heads * a.seq_q * a.seq_kv;
  // What the call holds at once: the buffers, and for the oneDNN twins of
  // softmax_v and attention a score tensor of their own (plus, causal with
  // Sq > 1, a full-size cached mask).  At S = 8192 each is 2 GiB.
  double bytes = 4.0 * ((kernel.uses_qk ? q_count + kv_count : 0) +
                        (kernel.uses_v ? kv_count + q_count : 0) +
                        (kernel.uses_scores ? s_count : 0));
  if (onednn && kernel.uses_v) bytes += 4.0 * s_count;
  if (onednn && a.causal && a.seq_q > 1) bytes += 4.0 * s_count;
  if (!FitsInMemory(state, bytes, onednn ? "the oneDNN twin" : "headsum")) return;
  try {
    if (kernel.uses_qk) {
      buffers.q = Floats(q_count, offset);
      buffers.q.FillRandom(1, 1.0f);
      buffers.k = Floats(kv_count, offset);
      buffers.k.FillRandom(2, 1.0f);
    }
    if (kernel.uses_v) {
      buffers.v = Floats(kv_count, offset);
      buffers.v.FillRandom(3, 1.0f);
      buffers.out = Floats(q_count, offset);
    }
    if (kernel.uses_scores) {
      buffers.scores = Floats(s_count, offset);
      buffers.scores.FillRandom(4, 3.0f);  // the spread of scaled dot products
    }
  } catch (const std::bad_alloc&) {
    state.SkipWithError("skipped: the benchmark's buffers could not be allocated");
    return;
  }
  const AttnCall call = onednn ? kernel.onednn : kernel.headsum;
  const char* what = onednn ? "oneDNN twin" : "headsum kernel";

  // One untimed call: checks the status, builds oneDNN's primitives and
  // mask, and faults in the output pages.
  headsum_status status = call(&shape, buffers);
  if (status == HEADSUM_ERR_OUT_OF_MEMORY) {
    state.SkipWithError(("skipped: out of memory: " + StatusMessage(what, status)).c_str());
    return;
  }
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

void RunProject(benchmark::State& state, ProjImpl impl, headsum_proj_shape shape, int threads,
                size_t offset) {
  if (!SetThreads(state, threads)) return;
  const size_t b = static_cast<size_t>(shape.batch), s = static_cast<size_t>(shape.seq);
  const size_t inner = static_cast<size_t>(shape.heads * shape.head_dim);
  const size_t d = static_cast<size_t>(shape.model_dim);
  ProjBuffers buffers;
  // oneDNN's twin also concatenates O into scratch of O's size.
  const double bytes = 4.0 * ((impl == ProjImpl::kOnednn ? 2 : 1) * b * s * inner + inner * d +
                              d + b * s * d);
  if (!FitsInMemory(state, bytes, impl == ProjImpl::kOnednn ? "the oneDNN twin" : "headsum")) {
    return;
  }
  try {
    buffers.heads = Floats(b * s * inner, offset);
    buffers.heads.FillRandom(5, 1.0f);
    buffers.wo = Floats(inner * d, offset);
    buffers.wo.FillRandom(6, 0.05f);
    buffers.bias = Floats(d, offset);
    buffers.bias.FillRandom(7, 0.1f);
    buffers.y = Floats(b * s * d, offset);
  } catch (const std::bad_alloc&) {
    state.SkipWithError("skipped: the benchmark's buffers could not be allocated");
    return;
  }
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
  if (status == HEADSUM_ERR_OUT_OF_MEMORY) {
    state.SkipWithError(("skipped: out of memory: " + StatusMessage(what, status)).c_str());
    return;
  }
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
// Registration: headsum and its twin next to each other, each at both
// buffer offsets.

const char* ImplName(bool onednn) { return onednn ? "onednn" : "headsum"; }

// "/off:16" for offset buffers; nothing for aligned ones, so that their
// names stay those of earlier runs (bench/results).
std::string OffsetPart(size_t offset) {
  return offset == 0 ? std::string() : "/off:" + std::to_string(offset);
}

std::string AttnName(const AttnKernel& kernel, bool onednn, const headsum_attn_shape& s,
                     int threads, size_t offset = 0) {
  return std::string("BM_") + kernel.name + "/" + ImplName(onednn) +
         "/B:" + std::to_string(s.batch) + "/H:" + std::to_string(s.heads) +
         "/Hkv:" + std::to_string(s.kv_heads) + "/Sq:" + std::to_string(s.seq_q) +
         "/Skv:" + std::to_string(s.seq_kv) + "/L:" + std::to_string(s.head_dim) +
         "/causal:" + std::to_string(s.causal) + OffsetPart(offset) +
         "/threads:" + std::to_string(threads);
}

std::string ProjName(ProjImpl impl, const headsum_proj_shape& s, int threads,
                     size_t offset = 0) {
  const std::string kernel =
      impl == ProjImpl::kPacked ? "BM_project_heads_sum_packed/" : "BM_project_heads_sum/";
  return kernel + ImplName(impl == ProjImpl::kOnednn) + "/B:" + std::to_string(s.batch) +
         "/S:" + std::to_string(s.seq) + "/H:" + std::to_string(s.heads) +
         "/L:" + std::to_string(s.head_dim) + "/D:" + std::to_string(s.model_dim) +
         OffsetPart(offset) + "/threads:" + std::to_string(threads);
}

headsum_attn_shape AttnShape(int64_t seq_q, int64_t seq_kv, bool causal) {
  return SeedAt(seq_q, seq_kv, causal).attn(/*scale=*/0.0f);  // 0: 1/sqrt(L)
}

void RegisterAttnPair(const AttnKernel& kernel, const headsum_attn_shape& shape, int threads) {
  for (const size_t offset : kOffsets) {
    for (const bool onednn : {false, true}) {
      benchmark::RegisterBenchmark(
          AttnName(kernel, onednn, shape, threads, offset).c_str(),
          [&kernel, onednn, shape, threads, offset](benchmark::State& state) {
            RunAttn(state, kernel, onednn, shape, threads, offset);
          })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

void RegisterProjTriple(const headsum_proj_shape& shape, int threads) {
  for (const size_t offset : kOffsets) {
    for (const ProjImpl impl : {ProjImpl::kHeadsum, ProjImpl::kOnednn, ProjImpl::kPacked}) {
      benchmark::RegisterBenchmark(ProjName(impl, shape, threads, offset).c_str(),
                                   [impl, shape, threads, offset](benchmark::State& state) {
                                     RunProject(state, impl, shape, threads, offset);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

// The same kernels forced onto lower targets: no target may stay a naive
// loop.  BM_<kernel>/at_<TARGET>/..., pct_peak against that target's own
// measured peak (its context key peak_gflops_<TARGET>).  Both offsets.
void RegisterLowerTargets() {
  static const char* const kTargets[] = {"AVX2", "SSE4"};
  for (const char* target : kTargets) {
    const double peak = MeasureTargetPeak(target);
    if (peak <= 0) continue;
    benchmark::AddCustomContext(std::string("peak_gflops_") + target, std::to_string(peak));
    for (const size_t offset : kOffsets) {
      for (const AttnKernel& kernel : kAttnKernels) {
        if (std::strcmp(kernel.name, "attention") != 0) continue;
        for (const bool causal : {false, true}) {
          const headsum_attn_shape shape = AttnShape(512, 512, causal);
          std::string name = AttnName(kernel, false, shape, 1, offset);
          name.replace(name.find("/headsum/"), 9, std::string("/at_") + target + "/");
          benchmark::RegisterBenchmark(
              name.c_str(),
              [&kernel, shape, target, peak, offset](benchmark::State& state) {
                if (headsum_set_target(target) != HEADSUM_OK) {
                  state.SkipWithError(headsum_last_error());
                  return;
                }
                const double best = g_peak_gflops_per_core;
                g_peak_gflops_per_core = peak;
                RunAttn(state, kernel, false, shape, 1, offset);
                g_peak_gflops_per_core = best;
                headsum_set_target(nullptr);
              })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
      const headsum_proj_shape shape = SeedAt(512, 512, false).proj();
      std::string name = ProjName(ProjImpl::kHeadsum, shape, 1, offset);
      name.replace(name.find("/headsum/"), 9, std::string("/at_") + target + "/");
      benchmark::RegisterBenchmark(name.c_str(),
                                   [shape, target, peak, offset](benchmark::State& state) {
                                     if (headsum_set_target(target) != HEADSUM_OK) {
                                       state.SkipWithError(headsum_last_error());
                                       return;
                                     }
                                     const double best = g_peak_gflops_per_core;
                                     g_peak_gflops_per_core = peak;
                                     RunProject(state, ProjImpl::kHeadsum, shape, 1, offset);
                                     g_peak_gflops_per_core = best;
                                     headsum_set_target(nullptr);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

// ---------------------------------------------------------------------------
// Read-bandwidth probe: BM_read_bandwidth/probe/bytes:N/threads:T sums a
// 64-byte aligned buffer of N bytes, repeated (the threads each sum one
// half), and reports GB/s.  N is the K+V size of a decode row, so that the
// table can give the row's K/V read rate as a share of what reading the same
// bytes alone reaches on this machine, in the same run.

void RunReadBandwidth(benchmark::State& state, size_t bytes, int threads) {
  if (!FitsInMemory(state, static_cast<double>(bytes), "the read-bandwidth probe")) return;
  // Whole chunks of 128 floats (every target's 8 vectors) per thread.
  const size_t floats = bytes / sizeof(float) / (128 * threads) * (128 * threads);
  Floats buffer;
  try {
    buffer = Floats(floats, 0);
  } catch (const std::bad_alloc&) {
    state.SkipWithError("skipped: the probe's buffer could not be allocated");
    return;
  }
  // Small values: the sum stays finite; pages are faulted in here.
  std::fill(buffer.data(), buffer.data() + floats, 1.0f / 1024);
  const size_t chunk = floats / static_cast<size_t>(threads);
  float partial[64] = {};
  const auto sweep = [&] {
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
#endif
    for (int t = 0; t < threads; ++t) {
      partial[t * 16] = SumFloats(buffer.data() + chunk * static_cast<size_t>(t), chunk);
    }
  };
  sweep();  // warm-up: the same state of the caches the kernels' rows meet
  const LoopTimer timer;
  for (auto _ : state) {
    sweep();
    benchmark::DoNotOptimize(partial);
  }
  const double seconds = timer.Seconds();
  if (seconds > 0 && state.iterations() > 0) {
    state.counters["GB/s"] = static_cast<double>(floats * sizeof(float)) *
                             static_cast<double>(state.iterations()) / seconds * 1e-9;
  }
}

// The K+V bytes of a decode row (f32).
size_t KvBytes(const headsum_attn_shape& s) {
  const int64_t kv_heads = s.kv_heads == 0 ? s.heads : s.kv_heads;
  return static_cast<size_t>(2 * s.batch * kv_heads * s.seq_kv * s.head_dim) * sizeof(float);
}

// Fixed cost of waking the OpenMP team: an empty parallel region of
// `threads` threads (what a call that splits its work pays at least once).
void RunForkJoin(benchmark::State& state, int threads) {
  int sink = 0;
  for (auto _ : state) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
    { benchmark::DoNotOptimize(sink); }
  }
}

// The long-cache decode step: H = 32, L = 128, Skv = 32768, f32 K+V 1 GiB.
headsum_attn_shape LongCacheDecode() {
  headsum_attn_shape s = AttnShape(kDecodeSeqQ, kLongDecodeSeqKv, true);
  s.heads = s.kv_heads = kLongDecodeHeads;
  s.head_dim = kLongDecodeHeadDim;
  return s;
}

// The tiny attention call of the fixed-cost rows: B=1 H=1 Sq=Skv=1 L=64.
headsum_attn_shape TinyAttn() {
  headsum_attn_shape s = AttnShape(1, 1, false);
  s.heads = s.kv_heads = 1;
  return s;
}

void RegisterAll() {
  for (const AttnKernel& kernel : kAttnKernels) {
    const bool attention = std::strcmp(kernel.name, "attention") == 0;
    for (const int64_t seq : kSeqLens) {
      for (const bool causal : {false, true}) {
        for (const int threads : kThreadCounts) {
          RegisterAttnPair(kernel, AttnShape(seq, seq, causal), threads);
        }
      }
    }
    if (attention) {
      for (const int64_t seq : kLongSeqLens) {
        for (const bool causal : {false, true}) {
          for (const int threads : kThreadCounts) {
            RegisterAttnPair(kernel, AttnShape(seq, seq, causal), threads);
          }
        }
      }
      for (const int threads : kThreadCounts) {
        RegisterAttnPair(kernel, AttnShape(kDecodeSeqQ, kDecodeSeqKv, true), threads);
      }
      for (const int threads : kThreadCounts) {
        headsum_attn_shape gqa = AttnShape(kDecodeSeqQ, kDecodeSeqKv, true);
        gqa.kv_heads = kDecodeGqaKvHeads;
        RegisterAttnPair(kernel, gqa, threads);
      }
      for (const int threads : kThreadCounts) {
        RegisterAttnPair(kernel, LongCacheDecode(), threads);
      }
      for (const int threads : kThreadCounts) RegisterAttnPair(kernel, TinyAttn(), threads);
    }
  }
  for (const int64_t seq : kSeqLens) {
    for (const int threads : kThreadCounts) RegisterProjTriple(SeedAt(seq, seq, false).proj(), threads);
  }
  for (const int64_t seq : kLongSeqLens) {
    for (const int threads : kThreadCounts) RegisterProjTriple(SeedAt(seq, seq, false).proj(), threads);
  }
  {
    // The tiny projection of the fixed-cost rows: S=1 H=1 L=64 D=64.
    headsum_proj_shape tiny = SeedAt(1, 1, false).proj();
    tiny.heads = 1;
    tiny.model_dim = 64;
    for (const int threads : kThreadCounts) RegisterProjTriple(tiny, threads);
  }

  // The probe at each decode row's K+V size, and at the long cache's 16-bit
  // size (512 MiB: what the 16-bit kernels will read).
  std::vector<size_t> sizes = {KvBytes(AttnShape(kDecodeSeqQ, kDecodeSeqKv, true))};
  headsum_attn_shape gqa = AttnShape(kDecodeSeqQ, kDecodeSeqKv, true);
  gqa.kv_heads = kDecodeGqaKvHeads;
  sizes.push_back(KvBytes(gqa));
  sizes.push_back(KvBytes(LongCacheDecode()));
  sizes.push_back(KvBytes(LongCacheDecode()) / 2);
  for (const size_t bytes : sizes) {
    for (const int threads : kThreadCounts) {
      const std::string name = "BM_read_bandwidth/probe/bytes:" + std::to_string(bytes) +
                               "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), [bytes, threads](benchmark::State& state) {
        RunReadBandwidth(state, bytes, threads);
      })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const int threads : kThreadCounts) {
    const std::string name = "BM_fixed_cost/omp_fork_join/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), [threads](benchmark::State& state) {
      RunForkJoin(state, threads);
    })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
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
