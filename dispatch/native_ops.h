// The native bf16 paths (kernels/native/) behind the tensor calls: which
// calls take them, and their work split across threads (the same split as
// the Highway kernels: 64-row blocks, grouped decode heads, 512-key splits
// merged in key order, so results do not depend on the thread count).
#ifndef HEADSUM_DISPATCH_NATIVE_OPS_H_
#define HEADSUM_DISPATCH_NATIVE_OPS_H_

#include <stddef.h>
#include <stdint.h>

#include <initializer_list>

#include "headsum/headsum.h"
#include "hwy/aligned_allocator.h"
#include "kernels/native/native.h"
#include "kernels/shapes.h"

namespace headsum {
namespace dispatch {

// The native path a call with these input dtypes takes now, or nullptr:
// one is in force and either every input is bf16 or fpmath is BF16.
const native::Path* NativeFor(std::initializer_list<DType> inputs);

// Whether an attention call that NativeFor sends to `path` runs on the f32
// kernels instead: on AMX_BF16, q, K and V all bf16 (exact in f32) and rows
// too few for a tile (a decode step's one row or kv group, Sq < 8), which
// would run on VDPBF16PS; on Sapphire Rapids that instruction does about
// half the work per cycle of the f32 FMA (probes 75 vs 138 GFLOP/s), and
// the f32 kernels reading the bf16 K/V in place are faster (README, "Native
// bf16 arithmetic").  f32 inputs under fpmath BF16 stay native (the f32
// kernels would not round them).
bool NativeFewRowsOnF32(const native::Path& path, const AttnDims& a, const AttnViews& views);

headsum_status NativeAttention(const native::Path& path, const AttnDims& a,
                               const AttnViews& views);

// Y = bias + sum_h O_h Wo[h] from Wo (a view of [H*L][D] rows) packed per
// call, or from `packed` (NativePackWo) when wo is null.
headsum_status NativeProjection(const native::Path& path, const ProjDims& p,
                                const TensorView& heads, const TensorView* wo,
                                const uint16_t* packed, const float* bias, const TensorView& y);

// Wo in the native panels (kernels/native/native.h, u16 elements in a float
// allocation); null when memory is short.
hwy::AlignedFreeUniquePtr<float[]> NativePackWo(const native::Path& path, const ProjDims& p,
                                                   const TensorView& wo);

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_NATIVE_OPS_H_
