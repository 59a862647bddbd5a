// profile_call: one kernel call, repeated, for a profiler (valgrind
// --tool=callgrind or cachegrind, perf where the machine exposes counters).
// The first call is a warm-up; with callgrind the counts are zeroed after it
// (CALLGRIND_ZERO_STATS), so they cover `reps` calls of the steady state.
//
//   profile_call KERNEL S OFFSET_BYTES REPS [THREADS [CHUNKS]]
//     KERNEL: proj | proj_packed | proj_onednn      (B=1 H=8 L=64 D=512, S rows)
//     CHUNKS (projections): the S rows as CHUNKS calls of S/CHUNKS rows on
//             separate buffers: what an outer blocking of the rows (with
//             the O block packed) would give, measured with today's kernel
//             attn | attn_onednn                   (B=1 H=8 L=64, Sq=Skv=S)
//             attn_bshd[_causal]                   (the same, Q/K/V/O token-major)
//             decode | decode_onednn               (Sq=1, Skv=S, H=8)
//             decode_gqa | decode_gqa_onednn       (the same with Hkv=2)
//             cache_{f32,f16,bf16}[_gqa][_native][_l64]  decode over a long
//                   cache through headsum_attention_tensors: H=32 L=128 (64
//                   with _l64) Skv=S,
//                   K/V of that dtype (Hkv=8 with _gqa), q and out f32 (bf16
//                   with _native: the native bf16 path where the CPU has one)
//
// e.g. valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 \
//        --LL=1048576,8,64 build-bench/bench/headsum_profile_call proj 2048 16 1
// (LL = this machine's per-core L2, so LL misses are what L2 cannot hold.)
// Valgrind has no AVX-512: under it Highway dispatches to AVX2.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "headsum/headsum.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#endif

namespace {

float* Buffer(size_t count, size_t offset_bytes, uint32_t seed) {
  const size_t offset = offset_bytes / sizeof(float);
  const size_t bytes = ((count + offset) * sizeof(float) + 63) / 64 * 64;
  float* base = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (base == nullptr) {
    std::perror("aligned_alloc");
    std::exit(1);
  }
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < count + offset; ++i) {
    state = state * 1664525u + 1013904223u;
    base[i] = static_cast<float>(state >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
  return base + offset;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s KERNEL S OFFSET_BYTES REPS [THREADS]\n", argv[0]);
    return 2;
  }
  const std::string kernel = argv[1];
  const int64_t seq = std::atoll(argv[2]);
  const size_t offset = static_cast<size_t>(std::atoll(argv[3]));
  const int reps = std::atoi(argv[4]);
  headsum_set_num_threads(argc > 5 ? std::atoi(argv[5]) : 1);
  const int64_t chunks = argc > 6 ? std::atoll(argv[6]) : 1;
  const int64_t B = 1, H = 8, L = 64, D = 512;

  headsum_status status = HEADSUM_OK;
  double flops = 0;
  // Per call: wall time, and the process's CPU time (on a shared machine,
  // time spent waiting for a core is in the first and not the second; with
  // one thread the CPU time is the call's own time).
  std::vector<double> wall, cpu;
  const auto cpu_now = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const auto timed = [&](auto&& call) {
    status = call();  // warm-up: primitives, scratch, pages
    if (status != HEADSUM_OK) return;
    CALLGRIND_ZERO_STATS;
    for (int i = 0; i < reps && status == HEADSUM_OK; ++i) {
      const double c0 = cpu_now();
      const auto start = std::chrono::steady_clock::now();
      status = call();
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      cpu.push_back(cpu_now() - c0);
    }
  };
  if (kernel.rfind("proj", 0) == 0) {
    if (chunks < 1 || seq % chunks != 0) {
      std::fprintf(stderr, "CHUNKS must divide S\n");
      return 2;
    }
    headsum_proj_shape p = {B, seq / chunks, H, L, D};
    std::vector<float*> o(static_cast<size_t>(chunks)), y(static_cast<size_t>(chunks));
    for (int64_t c = 0; c < chunks; ++c) {
      o[static_cast<size_t>(c)] = Buffer(static_cast<size_t>(B * H * p.seq * L), offset, 1);
      y[static_cast<size_t>(c)] = Buffer(static_cast<size_t>(B * p.seq * D), offset, 4);
    }
    float* wo = Buffer(static_cast<size_t>(H * L * D), offset, 2);
    float* bias = Buffer(static_cast<size_t>(D), offset, 3);
    flops = 2.0 * B * seq * H * L * D;
    const auto each = [&](auto&& one) {
      headsum_status st = HEADSUM_OK;
      for (size_t c = 0; c < o.size() && st == HEADSUM_OK; ++c) st = one(o[c], y[c]);
      return st;
    };
    if (kernel == "proj") {
      timed([&] {
        return each([&](float* oc, float* yc) {
          return headsum_project_heads_sum(&p, oc, wo, bias, yc);
        });
      });
    } else if (kernel == "proj_packed") {
      headsum_wo_packed* packed = nullptr;
      status = headsum_wo_pack(&p, wo, &packed);
      if (status == HEADSUM_OK) {
        timed([&] {
          return each([&](float* oc, float* yc) {
            return headsum_project_heads_sum_packed(&p, oc, packed, bias, yc);
          });
        });
      }
      headsum_wo_free(packed);
    } else if (kernel == "proj_onednn") {
      timed([&] {
        return each([&](float* oc, float* yc) {
          return headsum_concat_project_onednn(&p, oc, wo, bias, yc);
        });
      });
    } else {
      std::fprintf(stderr, "unknown kernel %s\n", kernel.c_str());
      return 2;
    }
  } else if (kernel.rfind("cache_", 0) == 0) {
    const bool gqa = kernel.find("_gqa") != std::string::npos;
    const bool native = kernel.find("_native") != std::string::npos;
    const headsum_dtype kv_t = kernel.rfind("cache_f16", 0) == 0    ? HEADSUM_F16
                               : kernel.rfind("cache_bf16", 0) == 0 ? HEADSUM_BF16
                                                                    : HEADSUM_F32;
    const headsum_dtype q_t = native ? HEADSUM_BF16 : HEADSUM_F32;
    const int64_t Hc = 32, Hkv = gqa ? 8 : 32;
    const int64_t Lc = kernel.find("_l64") != std::string::npos ? 64 : 128;
    const headsum_attn_shape a = {B, Hc, Hkv, 1, seq, Lc, 0.0f, 1};
    // 16-bit buffers: the f32 values in (-0.5, 0.5) converted (nearest even).
    const auto half = [&](float* f, size_t n, headsum_dtype t) -> float* {
      if (t == HEADSUM_F32) return f;
      float* h = Buffer((n + 1) / 2, offset, 0);
      const int64_t dims[4] = {1, 1, 1, static_cast<int64_t>(n)};
      const headsum_tensor src = headsum_bhsd(f, HEADSUM_F32, 1, 1, static_cast<int64_t>(n));
      const headsum_tensor dst = headsum_bhsd(h, t, 1, 1, static_cast<int64_t>(n));
      if (headsum_convert(dims, &src, &dst) != HEADSUM_OK) {
        std::fprintf(stderr, "convert: %s\n", headsum_last_error());
        std::exit(1);
      }
      std::free(f - offset / sizeof(float));
      return h;
    };
    const size_t nq = size_t(Hc * Lc), nkv = size_t(Hkv * seq * Lc);
    float* q = half(Buffer(nq, offset, 1), nq, q_t);
    float* k = half(Buffer(nkv, offset, 2), nkv, kv_t);
    float* v = half(Buffer(nkv, offset, 3), nkv, kv_t);
    float* out = half(Buffer(nq, offset, 4), nq, q_t);
    const headsum_tensor tq = headsum_bhsd(q, q_t, Hc, 1, Lc);
    const headsum_tensor tk = headsum_bhsd(k, kv_t, Hkv, seq, Lc);
    const headsum_tensor tv = headsum_bhsd(v, kv_t, Hkv, seq, Lc);
    const headsum_tensor to = headsum_bhsd(out, q_t, Hc, 1, Lc);
    flops = 4.0 * B * Hc * seq * Lc;
    timed([&] { return headsum_attention_tensors(&a, &tq, &tk, &tv, &to); });
  } else {
    const bool decode = kernel.rfind("decode", 0) == 0;
    const bool gqa = kernel.find("gqa") != std::string::npos;
    const bool onednn = kernel.find("onednn") != std::string::npos;
    headsum_attn_shape a = {};
    a.batch = B;
    a.heads = H;
    a.kv_heads = gqa ? 2 : H;
    a.seq_q = decode ? 1 : seq;
    a.seq_kv = seq;
    a.head_dim = L;
    a.scale = 0;
    a.causal = decode ? 1 : 0;
    float* q = Buffer(static_cast<size_t>(B * H * a.seq_q * L), offset, 1);
    float* k = Buffer(static_cast<size_t>(B * a.kv_heads * seq * L), offset, 2);
    float* v = Buffer(static_cast<size_t>(B * a.kv_heads * seq * L), offset, 3);
    float* out = Buffer(static_cast<size_t>(B * H * a.seq_q * L), offset, 4);
    flops = 4.0 * B * H * a.seq_q * seq * L;
    if (onednn) {
      timed([&] { return headsum_attention_onednn(&a, q, k, v, out); });
    } else if (kernel.rfind("attn_bshd", 0) == 0) {
      // Token-major Q/K/V/O ([B][S][H][L]) through headsum_attention_tensors.
      a.causal = kernel.find("_causal") != std::string::npos ? 1 : 0;
      if (a.causal) flops *= 0.5;
      const headsum_tensor tq = headsum_bshd(q, HEADSUM_F32, H, a.seq_q, L);
      const headsum_tensor tk = headsum_bshd(k, HEADSUM_F32, a.kv_heads, seq, L);
      const headsum_tensor tv = headsum_bshd(v, HEADSUM_F32, a.kv_heads, seq, L);
      const headsum_tensor to = headsum_bshd(out, HEADSUM_F32, H, a.seq_q, L);
      timed([&] { return headsum_attention_tensors(&a, &tq, &tk, &tv, &to); });
    } else {
      timed([&] { return headsum_attention(&a, q, k, v, out); });
    }
  }
  if (status != HEADSUM_OK) {
    std::fprintf(stderr, "%s: status %d: %s\n", kernel.c_str(), static_cast<int>(status),
                 headsum_last_error());
    return 1;
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double w = median(wall), c = median(cpu);
  std::printf("%s S=%lld chunks=%lld off=%zu target=%s reps=%d: median wall %.1f us "
              "(%.1f GFLOP/s), median cpu %.1f us (%.1f GFLOP/s), best wall %.1f us\n",
              kernel.c_str(), static_cast<long long>(seq), static_cast<long long>(chunks),
              offset, headsum_active_target(), reps, w * 1e6, flops / w * 1e-9, c * 1e6,
              flops / c * 1e-9, *std::min_element(wall.begin(), wall.end()) * 1e6);
  return 0;
}
