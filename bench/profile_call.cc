// profile_call: one kernel call, repeated, for a profiler (valgrind
// --tool=callgrind or cachegrind, perf where the machine exposes counters).
// The first call is a warm-up; with callgrind the counts are zeroed after it
// (CALLGRIND_ZERO_STATS), so they cover `reps` calls of the steady state.
//
//   profile_call KERNEL S OFFSET_BYTES REPS [THREADS]
//     KERNEL: proj | proj_packed | proj_onednn      (B=1 H=8 L=64 D=512, S rows)
//             attn | attn_onednn                   (B=1 H=8 L=64, Sq=Skv=S)
//             decode | decode_onednn               (Sq=1, Skv=S, H=8)
//             decode_gqa | decode_gqa_onednn       (the same with Hkv=2)
//
// e.g. valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 \
//        --LL=1048576,8,64 build-bench/bench/headsum_profile_call proj 2048 16 1
// (LL = this machine's per-core L2, so LL misses are what L2 cannot hold.)
// Valgrind has no AVX-512: under it Highway dispatches to AVX2.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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
  const int64_t B = 1, H = 8, L = 64, D = 512;

  headsum_status status = HEADSUM_OK;
  double flops = 0;
  std::chrono::duration<double> elapsed{};
  const auto timed = [&](auto&& call) {
    status = call();  // warm-up: primitives, scratch, pages
    if (status != HEADSUM_OK) return;
    CALLGRIND_ZERO_STATS;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps && status == HEADSUM_OK; ++i) status = call();
    elapsed = std::chrono::steady_clock::now() - start;
  };
  if (kernel.rfind("proj", 0) == 0) {
    headsum_proj_shape p = {B, seq, H, L, D};
    float* o = Buffer(static_cast<size_t>(B * H * seq * L), offset, 1);
    float* wo = Buffer(static_cast<size_t>(H * L * D), offset, 2);
    float* bias = Buffer(static_cast<size_t>(D), offset, 3);
    float* y = Buffer(static_cast<size_t>(B * seq * D), offset, 4);
    flops = 2.0 * B * seq * H * L * D;
    if (kernel == "proj") {
      timed([&] { return headsum_project_heads_sum(&p, o, wo, bias, y); });
    } else if (kernel == "proj_packed") {
      headsum_wo_packed* packed = nullptr;
      status = headsum_wo_pack(&p, wo, &packed);
      if (status == HEADSUM_OK) {
        timed([&] { return headsum_project_heads_sum_packed(&p, o, packed, bias, y); });
      }
      headsum_wo_free(packed);
    } else if (kernel == "proj_onednn") {
      timed([&] { return headsum_concat_project_onednn(&p, o, wo, bias, y); });
    } else {
      std::fprintf(stderr, "unknown kernel %s\n", kernel.c_str());
      return 2;
    }
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
    } else {
      timed([&] { return headsum_attention(&a, q, k, v, out); });
    }
  }
  if (status != HEADSUM_OK) {
    std::fprintf(stderr, "%s: status %d: %s\n", kernel.c_str(), static_cast<int>(status),
                 headsum_last_error());
    return 1;
  }
  const double per_call = elapsed.count() / reps;
  std::printf("%s S=%lld off=%zu target=%s: %.1f us/call, %.1f GFLOP/s\n", kernel.c_str(),
              static_cast<long long>(seq), offset, headsum_active_target(), per_call * 1e6,
              flops / per_call * 1e-9);
  return 0;
}
