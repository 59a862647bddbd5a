// Peak probes of the bf16 instructions the native paths use, one core:
// a VDPBF16PS chain (compiled with -mavx512bf16, see bench/CMakeLists.txt)
// and a TDPBF16PS chain (-mamx-tile -mamx-bf16).  Each runs only where the
// CPU has the instruction (headsum's own detection).
#include "bench/peak_bf16.h"

#include <chrono>
#include <cstdint>
#include <cstring>

#include "kernels/native/native.h"

#if defined(HEADSUM_BENCH_VDPBF16PS) || defined(HEADSUM_BENCH_TDPBF16PS)
#include <immintrin.h>
#endif

namespace headsum {
namespace bench {
namespace {

template <class F>
double BestOf5(const F& run) {
  run();  // warm-up
  double best = 0;
  for (int t = 0; t < 5; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    const double flops = run();
    const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    if (flops / s.count() > best) best = flops / s.count();
  }
  return best * 1e-9;
}

}  // namespace

#if defined(HEADSUM_BENCH_VDPBF16PS)
__attribute__((target("avx512f,avx512bf16"))) static double VdpChains(size_t reps) {
  // 12 independent accumulators, each VDPBF16PS = 32 multiply-adds = 64 flops.
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  // Normal numbers only (a denormal operand may take a slow path): acc grows
  // by 2^-19 per step, far from overflow.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80), b = (__m512bh)_mm512_set1_epi16(0x3600);
  for (size_t r = 0; r < reps; ++r) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  // Every chain feeds the result, so none is dead code.
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_cvtss_f32(sum);
  (void)sink;
  return 64.0 * 12.0 * double(reps);
}
#endif

double VdpBf16PeakGflops() {
#if defined(HEADSUM_BENCH_VDPBF16PS)
  if (!native::CpuHasAvx512Bf16()) return 0;
  return BestOf5([] { return VdpChains(size_t(1) << 22); });
#else
  return 0;
#endif
}

#if defined(HEADSUM_BENCH_TDPBF16PS)
__attribute__((target("amx-tile,amx-bf16"))) static double TdpChains(size_t reps) {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;
    cfg[48 + t] = 16;
  }
  alignas(64) static uint16_t a[16 * 32];
  alignas(64) static float c[16 * 16];
  _tile_loadconfig(cfg);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // Four accumulators (TDPBF16PS latency ~ 4x its issue interval), each
  // 16 x 16 x 32 multiply-adds = 16384 flops.
  for (size_t r = 0; r < reps; ++r) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  volatile float sink = c[0];
  (void)sink;
  return 4.0 * 16384.0 * double(reps);
}
#endif

double TdpBf16PeakGflops() {
#if defined(HEADSUM_BENCH_TDPBF16PS)
  if (!native::CpuHasAmxBf16()) return 0;
  return BestOf5([] { return TdpChains(size_t(1) << 18); });
#else
  return 0;
#endif
}

}  // namespace bench
}  // namespace headsum
