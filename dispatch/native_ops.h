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
// one is in force, it is not slower than the Highway kernels on this CPU
// (NativeSlowerThanHighway), and either every input is bf16 or fpmath is
// BF16.
const native::Path* NativeFor(std::initializer_list<DType> inputs);

// Whether the Highway kernels run every call of `path` faster on this CPU,
// so that with it in force the calls run on them (bf16 inputs widened to
// f32 exactly; f32 inputs under fpmath BF16 not rounded: fpmath permits
// bf16 arithmetic, it does not require it): AVX512_BF16 on Intel CPUs.
// There VDPBF16PS issues at half the f32 FMA's rate: on an Emerald Rapids
// class VM (2 cores, no AMX) bench/peak_bf16.cc's probe gave 81-86 GFLOP/s
// a core against the FMA probe's 171, and with bf16 inputs the Highway
// kernels ran attention 1.7-2.3x as fast as AVX512_BF16 (S=512 4.6 vs 7.8
// ms, S=2048 71 vs 132 ms, causal alike, a decode step over 4096 keys 325
// vs 713 us) and the projection 1.6-1.8x (S=512 2.2 vs 3.4 ms), one
// thread, medians of 3 (bench/results/intel-avx512.md).  On AMD Zen 4 the
// path ran bf16 attention 1.64x as fast as f32 (bench/results/amd-zen4.md).
// The kernels stay tested on Intel too (tests/native_test.cc calls them).
bool NativeSlowerThanHighway(const native::Path& path);

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
