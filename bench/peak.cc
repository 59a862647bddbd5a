// Peak probe: f32 FMA throughput of one core, compiled for every Highway
// target and run at the best one this CPU supports (the same set of targets
// the library dispatches over), so the binary stays portable.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `reps` rounds of 12 independent FMA chains; returns the flops done and
// writes a value derived from every chain to `sink` so none is dead code.
// 2 FMA ports x 4 cycles latency need >= 8 chains in flight; 12 leaves
// margin for a 5-cycle FMA and still fits AVX2's 16 registers.
double FmaChains(size_t reps, float* sink) {
  const hn::ScalableTag<float> d;
  // acc = acc * m + c converges to c / (1 - m): no overflow, no denormals.
  const auto m = hn::Set(d, 0.999999f);
  const auto c = hn::Set(d, 1e-6f);
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f);
  auto a3 = hn::Set(d, 1.3f), a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f);
  auto a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f), a8 = hn::Set(d, 1.8f);
  auto a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  for (size_t i = 0; i < reps; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  const auto sum = hn::Add(
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
      hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink = hn::GetLane(sum);
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(reps);
}

const char* TargetOfProbe() { return hwy::TargetName(HWY_TARGET); }

// Read-bandwidth probes: 8 independent accumulators so that the adds never
// wait on each other; the loads are the only limit.  Chains 0-3 read p,
// chains 4-7 read q, both `step` floats a round over [0, n).
HWY_INLINE float SumEightChains(const float* HWY_RESTRICT p, const float* HWY_RESTRICT q,
                                size_t n, size_t step) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  auto s4 = hn::Zero(d), s5 = hn::Zero(d), s6 = hn::Zero(d), s7 = hn::Zero(d);
  for (size_t i = 0; i + step <= n; i += step) {
    s0 = hn::Add(s0, hn::LoadU(d, p + i));
    s1 = hn::Add(s1, hn::LoadU(d, p + i + N));
    s2 = hn::Add(s2, hn::LoadU(d, p + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, p + i + 3 * N));
    s4 = hn::Add(s4, hn::LoadU(d, q + i));
    s5 = hn::Add(s5, hn::LoadU(d, q + i + N));
    s6 = hn::Add(s6, hn::LoadU(d, q + i + 2 * N));
    s7 = hn::Add(s7, hn::LoadU(d, q + i + 3 * N));
  }
  const auto sum = hn::Add(hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)),
                           hn::Add(hn::Add(s4, s5), hn::Add(s6, s7)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// The sum of n floats at p (n a multiple of 8 vectors), in address order.
float SumFloats(const float* HWY_RESTRICT p, size_t n) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  return SumEightChains(p, p + 4 * N, n, 8 * N);
}

// The sums of n floats at p and of n at q, the two read side by side (four
// vector chains each), as a decode step reads its K and V streams.
float SumFloats2(const float* HWY_RESTRICT p, const float* HWY_RESTRICT q, size_t n) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  return SumEightChains(p, q, n, 4 * N);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <time.h>

#include <algorithm>
#include <string>

#include "bench/peak.h"

namespace headsum {
namespace bench {

// The calling thread's CPU time: the probe's flops per second of the time
// it actually ran, so that other processes sharing the core (a busy or
// shared machine) do not lower the peak that %peak divides by.
double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

HWY_EXPORT(FmaChains);
HWY_EXPORT(TargetOfProbe);
HWY_EXPORT(SumFloats);

float SumFloats(const float* p, size_t n) { return HWY_DYNAMIC_DISPATCH(SumFloats)(p, n); }

HWY_EXPORT(SumFloats2);

float SumFloats2(const float* p, const float* q, size_t n) {
  return HWY_DYNAMIC_DISPATCH(SumFloats2)(p, q, n);
}

Peak MeasureSingleCorePeak() {
  float sink = 0.0f;
  // ~10^7 rounds: tens of ms at any width, long enough to reach boost clock.
  constexpr size_t kReps = size_t{1} << 23;
  HWY_DYNAMIC_DISPATCH(FmaChains)(kReps, &sink);  // warm-up
  double best = 0.0;
  for (int trial = 0; trial < 5; ++trial) {
    const double start = ThreadSeconds();
    const double flops = HWY_DYNAMIC_DISPATCH(FmaChains)(kReps, &sink);
    best = std::max(best, flops / (ThreadSeconds() - start));
  }
  volatile float keep = sink;  // the chains' result is observed
  (void)keep;
  return Peak{best * 1e-9, HWY_DYNAMIC_DISPATCH(TargetOfProbe)()};
}

double MeasureTargetPeak(const char* target) {
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    const int64_t t = rest & -rest;
    if (std::string(hwy::TargetName(t)) != target) continue;
    const bool runs = t == HWY_SCALAR || t == HWY_EMU128 || (hwy::SupportedTargets() & t) != 0;
    if (!runs) return 0.0;
    // The HWY_EXPORT table's entry for t (as dispatch/targets.cc computes it).
    const size_t index = (t == HWY_SCALAR || t == HWY_EMU128)
                             ? HWY_MAX_DYNAMIC_TARGETS + 1
                             : hwy::Num0BitsBelowLS1Bit_Nonzero64(
                                   static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(t)));
    const auto probe = HWY_DISPATCH_TABLE(FmaChains)[index];
    float sink = 0.0f;
    constexpr size_t kReps = size_t{1} << 22;
    probe(kReps, &sink);
    double best = 0.0;
    for (int trial = 0; trial < 5; ++trial) {
      const double start = ThreadSeconds();
      const double flops = probe(kReps, &sink);
      best = std::max(best, flops / (ThreadSeconds() - start));
    }
    volatile float keep = sink;
    (void)keep;
    return best * 1e-9;
  }
  return 0.0;
}

}  // namespace bench
}  // namespace headsum
#endif  // HWY_ONCE
