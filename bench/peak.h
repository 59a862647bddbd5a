// The machine's measured single-core f32 FMA peak, the denominator of every
// benchmark's pct_peak.
#ifndef HEADSUM_BENCH_PEAK_H_
#define HEADSUM_BENCH_PEAK_H_

#include <stddef.h>

namespace headsum {
namespace bench {

struct Peak {
  double gflops;       // f32 GFLOP/s of one core, FMA counted as 2 flops
  const char* target;  // Highway target the probe ran on, e.g. "AVX3_DL"
};

// Runs independent FMA chains on the calling thread for a few tens of
// milliseconds at the best Highway target this CPU supports; best of 5, each
// timed by the thread's CPU clock (time the thread waited for the core does
// not count).
Peak MeasureSingleCorePeak();

// The same probe forced onto the Highway target named `target` ("AVX2",
// "SSE4"...): that target's own peak, the yardstick of its kernels.  0 when
// this build did not compile it or the CPU cannot run it.
double MeasureTargetPeak(const char* target);

// The read-bandwidth probe's kernel: the sum of n floats at p (any
// alignment; n a multiple of 128, every target's 8 vectors), at the best
// target this CPU supports.
float SumFloats(const float* p, size_t n);
// Two streams read side by side: the sum of n floats at p and n at q (any
// alignment; n a multiple of 64, every target's 4 vectors).
float SumFloats2(const float* p, const float* q, size_t n);

}  // namespace bench
}  // namespace headsum

#endif  // HEADSUM_BENCH_PEAK_H_
