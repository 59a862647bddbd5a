// Exports the rotary embedding kernel for every compiled target and splits
// the tokens of a call across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/rope-inl.h"

#if HWY_ONCE
#include "dispatch/rope.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"

namespace headsum {
HWY_EXPORT(RotateHalfRows);

namespace dispatch {

// Tokens per work item: a decode step (one token) stays on the calling
// thread; a prefill splits into enough items for every thread.
constexpr size_t kRopeTokenBlock = 16;

headsum_status RotateHalf(const RopeDims& d, float* x, const float* table) {
  const auto kernel = HWY_DISPATCH_TABLE(RotateHalfRows)[TableIndex(ActiveTarget())];
  const size_t blocks = (d.seq + kRopeTokenBlock - 1) / kRopeTokenBlock;
  return ParallelItems(d.batch * blocks, 0, [&](size_t item, float*) {
    const size_t b = item / blocks, s0 = item % blocks * kRopeTokenBlock;
    const size_t s1 = s0 + kRopeTokenBlock < d.seq ? s0 + kRopeTokenBlock : d.seq;
    for (size_t s = s0; s < s1; ++s) {
      kernel(x + (b * d.seq + s) * d.token_stride, d.rows, d.row_stride, d.half,
             table + (d.pos0 + s) * 2 * d.half);
    }
  });
}

}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
