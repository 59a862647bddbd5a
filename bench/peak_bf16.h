// Single-core peaks of the bf16 dot-product instructions (GFLOP/s, a
// multiply-add counted as 2): the yardsticks of the native paths.  0 where
// the build or the CPU lacks the instruction.
#ifndef HEADSUM_BENCH_PEAK_BF16_H_
#define HEADSUM_BENCH_PEAK_BF16_H_

namespace headsum {
namespace bench {

double VdpBf16PeakGflops();  // VDPBF16PS (AVX512_BF16)
double TdpBf16PeakGflops();  // TDPBF16PS (AMX-BF16)

}  // namespace bench
}  // namespace headsum

#endif  // HEADSUM_BENCH_PEAK_BF16_H_
