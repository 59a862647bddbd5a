// tensor_bench: the tensor API (16-bit K/V and Wo, strided views) against
// headsum's own f32 contiguous calls and oneDNN's bf16 composed attention,
// with a read-bandwidth probe over the same bytes in the same run.
//
// Rows (each at 1 and 2 threads):
//   BM_decode/kv:{f32,f16,bf16}/H:32/Hkv:{32,8}/L:128/Skv:32768   one decode
//       step over a long cache (f32 K/V: 1 GiB); counter GB/s = K+V bytes
//       read per second
//   BM_read_probe/bytes:N    sums a buffer of N bytes (K+V's size), the
//       read bandwidth the decode rows are measured against
//   BM_read_probe2/bytes:N   the same bytes as two buffers of N/2 read side
//       by side (as a decode reads K and V; on the Zen 4 VM 3-10% more
//       than one stream); `scripts/bench.py tensor` divides by the faster probe
//   BM_decode_twin/{headsum,onednn}/kv:bf16/H:../Skv:..   headsum decode with
//       bf16 K/V vs oneDNN composed bf16 attention (matmul bf16 -> f32,
//       softmax, P in bf16, matmul bf16 -> f32)
//   BM_layout/{bhsd,bshd}/S:../causal:..     f32 attention, contiguous vs
//       token-major Q/K/V/O
//   BM_prefill/kv:{f32,f16,bf16}/S:../causal:..   f32 Q, 16-bit K/V
//   BM_projection/wo:{f32,bf16}/S:{1,20,512}     O f32, Wo f32 or bf16
//   BM_projection_stream/wo:{f32,bf16}/S:{1,20}  the same, each call on
//       another layer's Wo (a ring beyond the last-level cache): Wo from memory
//   BM_paired_decode/H:32/Hkv:{32,8}/..., BM_paired_views/S:../causal:..,
//   BM_paired_projection/S:1/wo:{cache,memory}   the ratios above again, from calls
//       alternated inside one benchmark (counters: medians over iterations
//       of ratios formed within one iteration; see TimeAlternated)
// `scripts/bench.py tensor` prints the ratios the tensor issue asks for.
// Defaults: --benchmark_repetitions=5 with aggregates only, and
// --benchmark_enable_random_interleaving=true (see main).  --offset=N starts
// every buffer N bytes past a 64-byte boundary (16: where std::vector's are).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/flags.h"
#include "bench/peak.h"
#include "headsum/headsum.h"

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
#include <dnnl.hpp>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

// Bytes past a 64-byte boundary at which every buffer starts (--offset=N, a
// multiple of 4 below 64; default 0): std::vector's and malloc's buffers are
// 16 bytes past one, and a speed counts only if it holds there too.
size_t g_offset = 0;

// A buffer of n elements of 2 or 4 bytes, random values, starting g_offset
// bytes past a 64-byte boundary.
struct Buffer {
  std::unique_ptr<char, void (*)(void*)> data{nullptr, std::free};
  size_t bytes = 0;
  char* start = nullptr;
  Buffer() = default;
  Buffer(size_t n, headsum_dtype t, uint32_t seed) {
    const size_t eb = t == HEADSUM_F32 ? 4 : 2;
    bytes = n * eb;
    data.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + g_offset + 63) / 64 * 64)));
    if (!data) throw std::bad_alloc();
    start = data.get() + g_offset;
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
      s = s * 1664525u + 1013904223u;
      const float f = (static_cast<float>(s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 2.0f;
      if (eb == 4) {
        memcpy(start + 4 * i, &f, 4);
      } else {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        // bf16 truncation or an f16 in [-1, 1]: any finite pattern will do here
        uint16_t h = t == HEADSUM_BF16 ? static_cast<uint16_t>(bits >> 16)
                                       : static_cast<uint16_t>(((s >> 8) & 0x3BFF) | ((s & 1) << 15));
        memcpy(start + 2 * i, &h, 2);
      }
    }
  }
  void* get() const { return start; }
};

headsum_dtype DtypeArg(int64_t v) { return static_cast<headsum_dtype>(v); }
const char* DtypeName(int64_t v) { return v == 0 ? "f32" : v == 1 ? "f16" : "bf16"; }

void SetThreads(benchmark::State& state, int threads) {
  if (headsum_set_num_threads(threads) != HEADSUM_OK) state.SkipWithError(headsum_last_error());
}

// ---------------------------------------------------------------------------
// Decode over a long cache.

void BM_decode(benchmark::State& state, headsum_dtype kv_t, int64_t H, int64_t Hkv, int64_t L,
               int64_t Skv, int threads) {
  SetThreads(state, threads);
  const headsum_attn_shape shape = {1, H, Hkv, 1, Skv, L, 0.0f, 1};
  Buffer q(size_t(H * L), HEADSUM_F32, 1), o(size_t(H * L), HEADSUM_F32, 2);
  Buffer k(size_t(Hkv * Skv * L), kv_t, 3), v(size_t(Hkv * Skv * L), kv_t, 4);
  headsum_tensor tq = headsum_bhsd(q.get(), HEADSUM_F32, H, 1, L);
  headsum_tensor tk = headsum_bhsd(k.get(), kv_t, Hkv, Skv, L);
  headsum_tensor tv = headsum_bhsd(v.get(), kv_t, Hkv, Skv, L);
  headsum_tensor to = headsum_bhsd(o.get(), HEADSUM_F32, H, 1, L);
  for (auto _ : state) {
    if (headsum_attention_tensors(&shape, &tq, &tk, &tv, &to) != HEADSUM_OK) {
      state.SkipWithError(headsum_last_error());
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(double(k.bytes + v.bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  headsum_set_num_threads(0);
}

// Sums `bytes` of memory (as f32, each thread one part, with bench/peak.cc's
// SumFloats: 8 independent vector chains at the best target): the read
// bandwidth a bandwidth-bound kernel can reach.  streams = 2: the bytes as
// two buffers of half each, read side by side (SumFloats2), as a decode
// reads K and V; on some machines that gets more than one stream.
class ReadProbe {
 public:
  ReadProbe(size_t bytes, int threads, int streams)
      : threads_(threads), streams_(streams),
        // Whole chunks of 128 floats (every target's 8 vectors) per thread and buffer.
        n_(bytes / 4 / size_t(streams) / (128 * size_t(threads)) * (128 * size_t(threads))),
        a_(n_, HEADSUM_F32, 5), b_(streams == 2 ? n_ : 0, HEADSUM_F32, 6) {}
  // The bytes one Sweep reads.
  double Bytes() const { return double(n_) * 4 * streams_; }
  void Sweep() {
    const float* p = static_cast<const float*>(a_.get());
    const float* q = static_cast<const float*>(b_.get());
    const size_t chunk = n_ / size_t(threads_);
#pragma omp parallel for num_threads(threads_) schedule(static, 1) if (threads_ > 1)
    for (int t = 0; t < threads_; ++t) {
      const size_t at = chunk * size_t(t);
      partial_[t * 16] = streams_ == 2 ? headsum::bench::SumFloats2(p + at, q + at, chunk)
                                       : headsum::bench::SumFloats(p + at, chunk);
    }
    benchmark::DoNotOptimize(partial_);
  }

 private:
  int threads_, streams_;
  size_t n_;
  Buffer a_, b_;
  float partial_[64] = {};
};

void BM_read_probe(benchmark::State& state, size_t bytes, int threads, int streams) {
  ReadProbe probe(bytes, threads, streams);
  probe.Sweep();  // warm-up: pages faulted in, the caches as the decode rows meet them
  for (auto _ : state) probe.Sweep();
  state.counters["GB/s"] = benchmark::Counter(probe.Bytes() * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------
// Layouts and 16-bit K/V in prefill.

void BM_attention_views(benchmark::State& state, bool token_major, headsum_dtype kv_t,
                        int64_t S, bool causal, int threads) {
  SetThreads(state, threads);
  const int64_t H = 8, L = 64;
  const headsum_attn_shape shape = {1, H, H, S, S, L, 0.0f, causal ? 1 : 0};
  Buffer q(size_t(H * S * L), HEADSUM_F32, 1), o(size_t(H * S * L), HEADSUM_F32, 2);
  Buffer k(size_t(H * S * L), kv_t, 3), v(size_t(H * S * L), kv_t, 4);
  auto view = token_major ? headsum_bshd : headsum_bhsd;
  headsum_tensor tq = view(q.get(), HEADSUM_F32, H, S, L);
  headsum_tensor tk = view(k.get(), kv_t, H, S, L);
  headsum_tensor tv = view(v.get(), kv_t, H, S, L);
  headsum_tensor to = view(o.get(), HEADSUM_F32, H, S, L);
  for (auto _ : state) {
    if (headsum_attention_tensors(&shape, &tq, &tk, &tv, &to) != HEADSUM_OK) {
      state.SkipWithError(headsum_last_error());
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * H * S * S * L * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  headsum_set_num_threads(0);
}

void BM_projection(benchmark::State& state, headsum_dtype wo_t, int64_t S, int threads) {
  SetThreads(state, threads);
  const int64_t H = 8, L = 64, D = 512;
  const headsum_proj_shape shape = {1, S, H, L, D};
  Buffer o(size_t(H * S * L), HEADSUM_F32, 1), wo(size_t(H * L * D), wo_t, 2),
      y(size_t(S * D), HEADSUM_F32, 3);
  headsum_tensor to = headsum_bhsd(o.get(), HEADSUM_F32, H, S, L);
  headsum_tensor tw = headsum_bhsd(wo.get(), wo_t, 1, H * L, D);
  headsum_tensor ty = headsum_bhsd(y.get(), HEADSUM_F32, 1, S, D);
  for (auto _ : state) {
    if (headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty) != HEADSUM_OK) {
      state.SkipWithError(headsum_last_error());
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * S * H * L * D * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  headsum_set_num_threads(0);
}

// The same projection as a decode step through a model runs it: each call
// reads another layer's Wo, from a ring of layers whose Wo together are at
// least 4x the last-level cache (sysconf; 32 MiB if unknown), so that every
// call's Wo comes from memory, as when the other layers' weights have
// evicted it.  BM_projection above reads one Wo over and over (cache-resident:
// 1 MiB f32).  Counter GB/s: Wo bytes read per second.
size_t LastLevelCacheBytes() {
  long l3 = -1;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return l3 > 0 ? static_cast<size_t>(l3) : size_t(32) << 20;
}

// Layers of an H*L x D Wo in a ring whose f32 Wo are together at least 4x
// the last-level cache (the same count for every dtype), at most 2 GiB.
size_t RingLayers(size_t wo_elements) {
  const size_t f32_bytes = wo_elements * 4;
  return std::min<size_t>(std::max<size_t>(4 * LastLevelCacheBytes() / f32_bytes + 1, 8),
                          (size_t(2) << 30) / f32_bytes);
}

void BM_projection_stream(benchmark::State& state, headsum_dtype wo_t, int64_t S, int threads) {
  SetThreads(state, threads);
  const int64_t H = 8, L = 64, D = 512;
  const headsum_proj_shape shape = {1, S, H, L, D};
  const size_t wo_bytes = size_t(H * L * D) * (wo_t == HEADSUM_F32 ? 4 : 2);
  const size_t layers = RingLayers(size_t(H * L * D));
  // One allocation for all the layers, as a model's weights are laid out.
  Buffer o(size_t(H * S * L), HEADSUM_F32, 1), y(size_t(S * D), HEADSUM_F32, 3);
  Buffer wo(layers * size_t(H * L * D), wo_t, 2);
  std::vector<headsum_tensor> tw;
  for (size_t i = 0; i < layers; ++i) {
    tw.push_back(headsum_bhsd(static_cast<char*>(wo.get()) + i * wo_bytes, wo_t, 1, H * L, D));
  }
  headsum_tensor to = headsum_bhsd(o.get(), HEADSUM_F32, H, S, L);
  headsum_tensor ty = headsum_bhsd(y.get(), HEADSUM_F32, 1, S, D);
  size_t i = 0;
  for (auto _ : state) {
    if (headsum_project_heads_sum_tensors(&shape, &to, &tw[i], nullptr, &ty) != HEADSUM_OK) {
      state.SkipWithError(headsum_last_error());
      break;
    }
    benchmark::ClobberMemory();
    i = i + 1 == layers ? 0 : i + 1;
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * S * H * L * D * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(wo_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["layers"] = static_cast<double>(layers);
  headsum_set_num_threads(0);
}

// ---------------------------------------------------------------------------
// Paired rows: the calls a ratio compares, alternated inside one benchmark.
// Separately timed rows (above) sample this shared VM's drift at different
// moments even when interleaved, and a ratio of two medians swung by up to
// 0.3 between runs of the same binary (bench/results/2026-12-07-zen3-
// session32.md); here every iteration times each call once, in an order
// rotated from one iteration to the next, and each counter is the median
// over the iterations of a ratio formed within one iteration (a short call
// is timed as a block of many).

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> x) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Runs every item once (a warm-up), then per benchmark iteration each item
// once, starting from item (iteration mod items), and returns per item the
// seconds of each of its runs (a block of `calls` calls, after `untimed`
// calls that are not timed, divided by `calls`).  An item returns false on
// an error: the state is then marked skipped, the times left incomplete.
std::vector<std::vector<double>> TimeAlternated(benchmark::State& state,
                                                const std::vector<std::function<bool()>>& items,
                                                int calls, int untimed = 0) {
  std::vector<std::vector<double>> seconds(items.size());
  const auto once = [&](size_t i) {
    for (int c = 0; c < untimed; ++c) {
      if (!items[i]()) return -1.0;
    }
    const auto t0 = Clock::now();
    for (int c = 0; c < calls; ++c) {
      if (!items[i]()) return -1.0;
    }
    return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    if (once(i) < 0) {
      state.SkipWithError(headsum_last_error());
      return seconds;
    }
  }
  size_t start = 0;
  for (auto _ : state) {
    for (size_t j = 0; j < items.size(); ++j) {
      const size_t i = (start + j) % items.size();
      const double sec = once(i);
      if (sec < 0) {
        state.SkipWithError(headsum_last_error());
        return seconds;
      }
      seconds[i].push_back(sec);
    }
    start = (start + 1) % items.size();
  }
  return seconds;
}

// The median over iterations of f(iteration).
template <class F>
double MedianOver(size_t iterations, const F& f) {
  std::vector<double> x;
  for (size_t it = 0; it < iterations; ++it) x.push_back(f(it));
  return Median(x);
}

// Decode over a long cache: K/V f32, f16 and bf16, and both read probes
// over the 16-bit K/V's bytes.  Counters: speed_f16, speed_bf16 (f32 time
// over 16-bit time), share_f16, share_bf16 (the 16-bit decode's K+V bytes a
// second over the faster probe's, both from the same iteration), and the
// median times in us.
void BM_paired_decode(benchmark::State& state, int64_t H, int64_t Hkv, int64_t L, int64_t Skv,
                      int threads) {
  SetThreads(state, threads);
  const headsum_attn_shape shape = {1, H, Hkv, 1, Skv, L, 0.0f, 1};
  const size_t kv_n = size_t(Hkv * Skv * L);
  Buffer q(size_t(H * L), HEADSUM_F32, 1), o(size_t(H * L), HEADSUM_F32, 2);
  const headsum_dtype types[3] = {HEADSUM_F32, HEADSUM_F16, HEADSUM_BF16};
  Buffer k[3], v[3];
  headsum_tensor tk[3], tv[3];
  for (int i = 0; i < 3; ++i) {
    k[i] = Buffer(kv_n, types[i], 3);
    v[i] = Buffer(kv_n, types[i], 4);
    tk[i] = headsum_bhsd(k[i].get(), types[i], Hkv, Skv, L);
    tv[i] = headsum_bhsd(v[i].get(), types[i], Hkv, Skv, L);
  }
  const headsum_tensor tq = headsum_bhsd(q.get(), HEADSUM_F32, H, 1, L);
  const headsum_tensor to = headsum_bhsd(o.get(), HEADSUM_F32, H, 1, L);
  // The probes read as many bytes as the 16-bit K and V (BM_read_probe).
  const size_t bytes16 = 2 * kv_n * 2;
  ReadProbe probes[2] = {ReadProbe(bytes16, threads, 1), ReadProbe(bytes16, threads, 2)};
  std::vector<std::function<bool()>> items;
  for (int i = 0; i < 3; ++i) {
    items.push_back([&, i] {
      return headsum_attention_tensors(&shape, &tq, &tk[i], &tv[i], &to) == HEADSUM_OK;
    });
  }
  for (ReadProbe& probe : probes) {
    items.push_back([&probe] {
      probe.Sweep();
      return true;
    });
  }
  const auto sec = TimeAlternated(state, items, 1);
  const size_t its = sec[4].size();
  if (its == 0) return;
  const auto best_probe = [&](size_t it) {  // bytes a second
    return std::max(probes[0].Bytes() / sec[3][it], probes[1].Bytes() / sec[4][it]);
  };
  for (int i = 1; i < 3; ++i) {
    const std::string dt = i == 1 ? "f16" : "bf16";
    state.counters["speed_" + dt] = MedianOver(its, [&](size_t it) { return sec[0][it] / sec[i][it]; });
    state.counters["share_" + dt] = MedianOver(its, [&](size_t it) {
      return double(bytes16) / sec[i][it] / best_probe(it);
    });
    state.counters["us_" + dt] = Median(sec[i]) * 1e6;
  }
  state.counters["us_f32"] = Median(sec[0]) * 1e6;
  state.counters["probe_GB/s"] = MedianOver(its, best_probe) * 1e-9;
  headsum_set_num_threads(0);
}

// Prefill attention (H=8, L=64): f32 contiguous, f32 token-major, f16 and
// bf16 K/V contiguous.  Counters: token_major (contiguous time over
// token-major time), speed_f16, speed_bf16 (f32 K/V time over 16-bit).
void BM_paired_views(benchmark::State& state, int64_t S, bool causal, int threads) {
  SetThreads(state, threads);
  const int64_t H = 8, L = 64;
  const headsum_attn_shape shape = {1, H, H, S, S, L, 0.0f, causal ? 1 : 0};
  const size_t n = size_t(H * S * L);
  Buffer q(n, HEADSUM_F32, 1), o(n, HEADSUM_F32, 2);
  Buffer k(n, HEADSUM_F32, 3), v(n, HEADSUM_F32, 4), kh(n, HEADSUM_F16, 3), vh(n, HEADSUM_F16, 4),
      kb(n, HEADSUM_BF16, 3), vb(n, HEADSUM_BF16, 4);
  struct Call {
    headsum_tensor q, k, v, o;
  };
  const auto call = [&](bool tm, const Buffer& kk, const Buffer& vv, headsum_dtype t) {
    auto view = tm ? headsum_bshd : headsum_bhsd;
    return Call{view(q.get(), HEADSUM_F32, H, S, L), view(kk.get(), t, H, S, L),
                view(vv.get(), t, H, S, L), view(o.get(), HEADSUM_F32, H, S, L)};
  };
  const Call calls[4] = {call(false, k, v, HEADSUM_F32), call(true, k, v, HEADSUM_F32),
                         call(false, kh, vh, HEADSUM_F16), call(false, kb, vb, HEADSUM_BF16)};
  std::vector<std::function<bool()>> items;
  for (int i = 0; i < 4; ++i) {
    items.push_back([&, i] {
      const Call& c = calls[i];
      return headsum_attention_tensors(&shape, &c.q, &c.k, &c.v, &c.o) == HEADSUM_OK;
    });
  }
  const auto sec = TimeAlternated(state, items, S <= 512 ? 4 : 1);
  const size_t its = sec[3].size();
  if (its == 0) return;
  const auto ratio = [&](size_t a, size_t b) {
    return MedianOver(its, [&](size_t it) { return sec[a][it] / sec[b][it]; });
  };
  state.counters["token_major"] = ratio(0, 1);
  state.counters["speed_f16"] = ratio(0, 2);
  state.counters["speed_bf16"] = ratio(0, 3);
  state.counters["us_f32"] = Median(sec[0]) * 1e6;
  headsum_set_num_threads(0);
}

// The decode step's projection (S=1, H=8, L=64, D=512), f32 and bf16 Wo,
// in blocks of 256 calls: one Wo read over and over (in cache: BM_projection),
// or each call another layer's Wo from a ring beyond the last-level cache
// (from memory: BM_projection_stream).  Counter speed_bf16: f32 time over
// bf16 time.
void BM_paired_projection(benchmark::State& state, bool from_memory, int threads) {
  SetThreads(state, threads);
  const int64_t S = 1, H = 8, L = 64, D = 512;
  const headsum_proj_shape shape = {1, S, H, L, D};
  const size_t layers = from_memory ? RingLayers(size_t(H * L * D)) : 1;
  Buffer o(size_t(H * S * L), HEADSUM_F32, 1), y(size_t(S * D), HEADSUM_F32, 3);
  Buffer w32(layers * size_t(H * L * D), HEADSUM_F32, 2), w16(layers * size_t(H * L * D), HEADSUM_BF16, 2);
  const headsum_tensor to = headsum_bhsd(o.get(), HEADSUM_F32, H, S, L);
  const headsum_tensor ty = headsum_bhsd(y.get(), HEADSUM_F32, 1, S, D);
  size_t next[2] = {0, 0};
  const auto call = [&](int which) {
    const Buffer& w = which == 0 ? w32 : w16;
    const headsum_dtype t = which == 0 ? HEADSUM_F32 : HEADSUM_BF16;
    const size_t bytes = size_t(H * L * D) * (which == 0 ? 4 : 2);
    const headsum_tensor tw =
        headsum_bhsd(static_cast<char*>(w.get()) + next[which] * bytes, t, 1, H * L, D);
    next[which] = next[which] + 1 == layers ? 0 : next[which] + 1;
    return headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty) == HEADSUM_OK;
  };
  // 16 untimed calls before each block: a block times the steady state of
  // its Wo (in cache: back in the caches after the other dtype's block).
  const auto sec = TimeAlternated(state, {[&] { return call(0); }, [&] { return call(1); }}, 256, 16);
  const size_t its = sec[1].size();
  if (its == 0) return;
  state.counters["speed_bf16"] = MedianOver(its, [&](size_t it) { return sec[0][it] / sec[1][it]; });
  state.counters["us_f32"] = Median(sec[0]) * 1e6;
  state.counters["us_bf16"] = Median(sec[1]) * 1e6;
  if (from_memory) state.counters["layers"] = static_cast<double>(layers);
  headsum_set_num_threads(0);
}

// ---------------------------------------------------------------------------
// oneDNN composed bf16 attention (decode): S = Q K^T (bf16 in, f32 out, with
// the scale), softmax (f32 in, bf16 out), O = P V (bf16 in, f32 out).

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
void BM_decode_onednn_bf16(benchmark::State& state, int64_t H, int64_t Hkv, int64_t L,
                           int64_t Skv, int threads) {
  using dnnl::memory;
  using dt = memory::data_type;
#if defined(_OPENMP)
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
#endif
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const int64_t G = H / Hkv;  // query heads per kv head: rows of one batched matmul
  const float scale = 1.0f / std::sqrt(float(L));
  // Q [Hkv][G][L], K [Hkv][Skv][L] read as K^T [Hkv][L][Skv], S [Hkv][G][Skv]
  memory::desc q_md({Hkv, G, L}, dt::bf16, memory::format_tag::abc);
  memory::desc kt_md({Hkv, L, Skv}, dt::bf16, memory::format_tag::acb);
  memory::desc s_md({Hkv, G, Skv}, dt::f32, memory::format_tag::abc);
  memory::desc p_md({Hkv, G, Skv}, dt::bf16, memory::format_tag::abc);
  memory::desc v_md({Hkv, Skv, L}, dt::bf16, memory::format_tag::abc);
  memory::desc o_md({Hkv, G, L}, dt::f32, memory::format_tag::abc);
  dnnl::primitive_attr qk_attr;
  qk_attr.set_output_scales(0, {scale});
  dnnl::matmul::primitive_desc qk_pd, pv_pd;
  dnnl::softmax_v2_forward::primitive_desc sm_pd;
  try {
    qk_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(q_md, kt_md, s_md), qk_attr, eng);
    sm_pd = dnnl::softmax_v2_forward::primitive_desc(
        dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                       dnnl::algorithm::softmax_accurate, s_md, p_md, 2),
        eng);
    pv_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p_md, v_md, o_md), eng);
  } catch (const dnnl::error& e) {
    // oneDNN 2.6 has bf16 matmuls only from AVX512_CORE on (an AVX2 CPU has none).
    state.SkipWithError((std::string("oneDNN has no bf16 attention on this CPU: ") + e.what()).c_str());
#if defined(_OPENMP)
    omp_set_num_threads(saved_threads);
#endif
    return;
  }
  Buffer q(size_t(H * L), HEADSUM_BF16, 1), k(size_t(Hkv * Skv * L), HEADSUM_BF16, 2),
      v(size_t(Hkv * Skv * L), HEADSUM_BF16, 3), s(size_t(H * Skv), HEADSUM_F32, 4),
      p(size_t(H * Skv), HEADSUM_BF16, 5), o(size_t(H * L), HEADSUM_F32, 6);
  memory mq(q_md, eng, q.get()), mk(kt_md, eng, k.get()), mv(v_md, eng, v.get()),
      ms(s_md, eng, s.get()), mp(p_md, eng, p.get()), mo(o_md, eng, o.get());
  dnnl::matmul qk(qk_pd), pv(pv_pd);
  dnnl::softmax_v2_forward sm(sm_pd);
  for (auto _ : state) {
    qk.execute(strm, {{DNNL_ARG_SRC, mq}, {DNNL_ARG_WEIGHTS, mk}, {DNNL_ARG_DST, ms}});
    sm.execute(strm, {{DNNL_ARG_SRC, ms}, {DNNL_ARG_DST, mp}});
    pv.execute(strm, {{DNNL_ARG_SRC, mp}, {DNNL_ARG_WEIGHTS, mv}, {DNNL_ARG_DST, mo}});
    strm.wait();
  }
  state.SetLabel(std::string("qk=") + qk_pd.impl_info_str() + " softmax=" +
                 sm_pd.impl_info_str() + " pv=" + pv_pd.impl_info_str());
  state.counters["GB/s"] = benchmark::Counter(double(k.bytes + v.bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
#if defined(_OPENMP)
  omp_set_num_threads(saved_threads);
#endif
}
#endif

void Register() {
  const int thread_counts[] = {1, 2};
  for (int threads : thread_counts) {
    const std::string t = "/threads:" + std::to_string(threads);
    // Long-cache decode, MHA and GQA, and the read probe over the same bytes.
    for (int64_t hkv : {32, 8}) {
      for (int64_t kv : {0, 1, 2}) {
        const std::string name = std::string("BM_decode/kv:") + DtypeName(kv) +
                                 "/H:32/Hkv:" + std::to_string(hkv) + "/L:128/Skv:32768" + t;
        benchmark::RegisterBenchmark(name.c_str(), BM_decode, DtypeArg(kv), 32, hkv, 128, 32768,
                                     threads)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
    for (size_t mib : {size_t(1024), size_t(512), size_t(256), size_t(128)}) {
      const std::string name = "BM_read_probe/bytes:" + std::to_string(mib) + "MiB" + t;
      benchmark::RegisterBenchmark(name.c_str(), BM_read_probe, mib << 20, threads, 1)
          ->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
    for (size_t mib : {size_t(512), size_t(128)}) {
      const std::string name = "BM_read_probe2/bytes:" + std::to_string(mib) + "MiB" + t;
      benchmark::RegisterBenchmark(name.c_str(), BM_read_probe, mib << 20, threads, 2)
          ->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
    // bf16 decode vs oneDNN's composed bf16 attention.
    for (auto hs : {std::array<int64_t, 4>{8, 8, 64, 4096}, std::array<int64_t, 4>{32, 32, 128, 32768},
                    std::array<int64_t, 4>{32, 8, 128, 32768}}) {
      const std::string shape = "/H:" + std::to_string(hs[0]) + "/Hkv:" + std::to_string(hs[1]) +
                                "/L:" + std::to_string(hs[2]) + "/Skv:" + std::to_string(hs[3]) + t;
      benchmark::RegisterBenchmark(("BM_decode_twin/headsum/kv:bf16" + shape).c_str(), BM_decode,
                                   HEADSUM_BF16, hs[0], hs[1], hs[2], hs[3], threads)
          ->UseRealTime()->Unit(benchmark::kMicrosecond);
#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
      benchmark::RegisterBenchmark(("BM_decode_twin/onednn/kv:bf16" + shape).c_str(),
                                   BM_decode_onednn_bf16, hs[0], hs[1], hs[2], hs[3], threads)
          ->UseRealTime()->Unit(benchmark::kMicrosecond);
#endif
    }
    for (int64_t S : {512, 2048}) {
      for (bool causal : {false, true}) {
        const std::string suffix = "/S:" + std::to_string(S) + "/causal:" +
                                   std::to_string(causal ? 1 : 0) + t;
        for (bool tm : {false, true}) {
          benchmark::RegisterBenchmark(
              (std::string("BM_layout/") + (tm ? "bshd" : "bhsd") + suffix).c_str(),
              BM_attention_views, tm, HEADSUM_F32, S, causal, threads)
              ->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
        for (int64_t kv : {0, 1, 2}) {
          benchmark::RegisterBenchmark(
              (std::string("BM_prefill/kv:") + DtypeName(kv) + suffix).c_str(),
              BM_attention_views, false, DtypeArg(kv), S, causal, threads)
              ->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
      }
    }
    for (int64_t S : {1, 20, 512}) {
      for (int64_t wo : {0, 2, 1}) {
        benchmark::RegisterBenchmark(
            (std::string("BM_projection/wo:") + DtypeName(wo) + "/S:" + std::to_string(S) + t)
                .c_str(),
            BM_projection, DtypeArg(wo), S, threads)
            ->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
    // The ratios again, each from calls alternated in one benchmark.
    for (int64_t hkv : {32, 8}) {
      benchmark::RegisterBenchmark(
          ("BM_paired_decode/H:32/Hkv:" + std::to_string(hkv) + "/L:128/Skv:32768" + t).c_str(),
          BM_paired_decode, 32, hkv, 128, 32768, threads)
          ->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    }
    for (int64_t S : {512, 2048}) {
      for (bool causal : {false, true}) {
        benchmark::RegisterBenchmark(("BM_paired_views/S:" + std::to_string(S) + "/causal:" +
                                      std::to_string(causal ? 1 : 0) + t).c_str(),
                                     BM_paired_views, S, causal, threads)
            ->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(S <= 512 ? 8 : 3);
      }
    }
    for (bool from_memory : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string("BM_paired_projection/S:1/wo:") + (from_memory ? "memory" : "cache") + t)
              .c_str(),
          BM_paired_projection, from_memory, threads)
          ->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(8);
    }
    for (int64_t S : {1, 20}) {
      for (int64_t wo : {0, 2, 1}) {
        benchmark::RegisterBenchmark(
            (std::string("BM_projection_stream/wo:") + DtypeName(wo) + "/S:" + std::to_string(S) + t)
                .c_str(),
            BM_projection_stream, DtypeArg(wo), S, threads)
            ->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Medians of 5 repetitions, run in random order across all rows, unless
  // the command line says otherwise: the ratios pair rows that would
  // otherwise run minutes apart, and this VM's speed drifts by 10-25% over
  // minutes (the same token-major call, S=2048 on one thread, took 72.6 ms
  // in one run and 91.3 ms in the next); interleaved, both rows of a ratio
  // sample the same drift.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    constexpr const char kOffset[] = "--offset=";
    if (i > 0 && strncmp(argv[i], kOffset, strlen(kOffset)) == 0) {
      char* end = nullptr;
      const long v = strtol(argv[i] + strlen(kOffset), &end, 10);
      if (end == argv[i] + strlen(kOffset) || *end != '\0' || v < 0 || v >= 64 || v % 4 != 0) {
        fprintf(stderr, "tensor_bench: --offset must be a multiple of 4 in [0, 60], got '%s'\n",
                argv[i] + strlen(kOffset));
        return 2;
      }
      g_offset = static_cast<size_t>(v);
      continue;
    }
    args.push_back(argv[i]);
  }
  using headsum::bench::HasFlag;
  const bool has_reps = HasFlag(argc, argv, "--benchmark_repetitions");
  const bool has_interleave = HasFlag(argc, argv, "--benchmark_enable_random_interleaving");
  std::string reps = "--benchmark_repetitions=5", agg = "--benchmark_report_aggregates_only=true",
              interleave = "--benchmark_enable_random_interleaving=true";
  if (!has_reps) {
    args.push_back(reps.data());
    args.push_back(agg.data());
  }
  if (!has_interleave) args.push_back(interleave.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::AddCustomContext("buffer_offset", std::to_string(g_offset));
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
