// Native reduced-precision paths (DESIGN.md, "Native reduced-precision
// arithmetic"): bf16 products with f32 accumulation on the instructions
// Highway 1.0.3 lacks.  One translation unit per instruction set, each with
// its own compile flags (cmake/HeadsumNative.cmake); this header is plain
// C++ and is all that dispatch/ sees of them.
//
//   AMX_BF16     x86 AMX tiles (TDPBF16PS); kernels/native/amx_bf16.cc
//   AVX512_BF16  x86 VDPBF16PS; kernels/native/avx512_bf16.cc
//   NEON_BF16    Arm BFDOT; kernels/native/neon_bf16.cc
//
// Numerics of every path: Q, K, V, O and Wo are read as bf16 (bf16 inputs
// as they are; f32 and f16 inputs rounded to nearest even once, which only
// happens when the caller opted in to bf16 arithmetic); products of two
// bf16 are exact in f32 and accumulate in f32; the online softmax runs in
// f32 with the scores in base 2 (log2 e folded into the scale, as the
// Highway kernels do); P is rounded to bf16 for P V (relative error <= 2^-8
// per term), its row sum l stays f32.
#ifndef HEADSUM_KERNELS_NATIVE_NATIVE_H_
#define HEADSUM_KERNELS_NATIVE_NATIVE_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/shapes.h"

namespace headsum {
namespace native {

// Keys per split of a decode step and the merge's record, as the Highway
// kernels use them (dispatch splits keys the same way for every target):
// per query row, acc[L] then m (base 2; NaN marks a row that saw a NaN) and l.
inline size_t PartialFloats(const AttnDims& a) { return a.head_dim + 2; }

// ---------------------------------------------------------------------------
// Packed Wo, shared by every native path (so a handle packed on one serves
// all): the inner index k = h*L + l runs over [0, Kp), Kp = H*L rounded up to
// 32 (zero rows past H*L); columns in panels of kPanelCols (the last one
// zero-padded).  Within a panel, row pair p (k = 2p, 2p+1) holds, for each
// of its columns n, the two bf16 Wo[2p][n], Wo[2p+1][n] next to each other:
//   packed[panel][p][n][t] = Wo[2p + t][panel*kPanelCols + n]
// i.e. each 16-column half of a pair row is one AMX B-tile row / one
// VDPBF16PS operand.
constexpr size_t kPanelCols = 32;
inline size_t InnerPadded(const ProjDims& p) { return (p.inner() + 31) / 32 * 32; }
inline size_t Panels(const ProjDims& p) { return (p.model_dim + kPanelCols - 1) / kPanelCols; }
inline size_t PackedWoElements(const ProjDims& p) {
  return Panels(p) * InnerPadded(p) * kPanelCols;
}
// Rows of Y per projection work item.
constexpr size_t kProjRows = 64;

// Query rows per attention work item (the Highway kernels' block).
constexpr size_t kQueryBlock = kAttentionQueryBlock;

// One native path: the kernels of one instruction set.
struct Path {
  const char* name;  // "AMX_BF16", "AVX512_BF16", "NEON_BF16"
  // Whether this CPU (and OS) runs it; for AMX this asks the kernel for the
  // tile state once (arch_prctl); a refusal is "cannot run".
  bool (*cpu_runs)();

  // Floats of per-thread scratch one attention work item needs.
  size_t (*attention_scratch)(const AttnDims& a);
  // Query rows [i0, i1) (at most kQueryBlock) of head (b, h) over keys
  // [key_begin, key_end).  partial == nullptr: final rows to v.out (any
  // dtype); else per row PartialFloats(a) floats (acc, m, l) for
  // MergePartials.  Q, K, V of any dtype (read as bf16, see above).
  void (*attention_rows)(const AttnDims& a, const AttnViews& v, size_t b, size_t h,
                         size_t i0, size_t i1, size_t key_begin, size_t key_end,
                         float* partial, float* scratch);

  // Wo (a view of [H*L][D] rows, row r at Row(0, 0, r)) into the packed
  // layout above, panels [panel0, panel1).
  void (*pack_wo)(const ProjDims& p, const TensorView& wo, uint16_t* packed, size_t panel0,
                  size_t panel1);
  size_t (*project_scratch)(const ProjDims& p);
  // Rows [s0, s1) (at most kProjRows) of Y for batch b, panels
  // [panel0, panel1) of the packed Wo: y = bias + sum_h O_h Wo[h], one f32
  // accumulator per element over h, then l.  heads: O [B][H][S][L] of any
  // dtype; y: (b, s, c) at Row(b, 0, s) + c, any dtype; bias f32 or null.
  void (*project_rows)(const ProjDims& p, const TensorView& heads, const uint16_t* packed_wo,
                       const float* bias, const TensorView& y, size_t b, size_t s0, size_t s1,
                       size_t panel0, size_t panel1, float* scratch);

  // Whether attention_rows honours a.window and a.opt (dispatch sends calls
  // with either to the Highway kernels when not).  Sinks are honoured in
  // the final rows; partial records leave them to MergePartials.
  bool takes_options = false;
};

// AMX_BF16: an item's rows below this run on VDPBF16PS (a tile would be
// mostly padding); from it up, in 16-row tile groups.
constexpr size_t kAmxMinTileRows = 8;

// The paths this build compiled, best first (nullptr-terminated list); a
// path not compiled (compiler without the flags, other architecture) is
// absent.
const Path* const* CompiledPaths();
// By name; nullptr when not compiled.
const Path* PathByName(const char* name);

// For the tests: the AMX kernels run on a software model of the tiles
// (TDPBF16PS's arithmetic per its pseudo-code, tile loads and stores as
// strided copies) instead of the tile instructions, so their packing and
// tile indexing can be checked on a CPU without AMX.  Needs AVX512_BF16
// (the softmax and packing around the tiles are AVX-512 code).  nullptr
// when the AMX path is not compiled.
const Path* AmxEmulatedPath();

// Combines the partial records of `splits` key ranges in their order into
// final rows [i0, i1) of head (b, h):
//   M = max_c m_c,  O = sum_c 2^(m_c - M) acc_c / sum_c 2^(m_c - M) l_c
// (with a.opt's sinks, the row's sink joins the denominator as SinkFactor
// says)
// partials: [splits][i1 - i0][PartialFloats(a)].
void MergePartials(const AttnDims& a, const float* partials, size_t splits,
                   const TensorView& out, size_t b, size_t h, size_t i0, size_t i1);

// log2(e): the kernels' scores are in base 2 (s log2 e).
constexpr float kLog2e = 1.44269504088896341f;

// A row's sink (base 2) joins its denominator: with M = max(m, sink2), acc
// and l scale by 2^(m - M) and l gains 2^(sink2 - M) (a row that saw no key
// gives zeros, its mass all the sink's; NaN stays NaN).  Returns the factor
// on acc (what 1 / l is without a sink).
inline float SinkFactor(float m, float l, float sink2) {
  const float M = m > sink2 ? m : sink2;
  const float scale = m == -__builtin_inff() ? 0.0f : __builtin_exp2f(m - M);
  return scale / (l * scale + __builtin_exp2f(sink2 - M));
}

// Stores n f32 values at dst in `dtype` (16-bit: rounded to nearest even,
// NaN stays NaN, beyond f16's range is inf).
void StoreRow(const float* src, size_t n, DType dtype, void* dst);
// Rounds one f32 to bf16 / f16 bits (round to nearest even).
uint16_t F32ToBf16(float f);
uint16_t F32ToF16(float f);
float Bf16ToF32(uint16_t b);
float F16ToF32(uint16_t h);

// Run-time detection, usable from anywhere (plain code).
bool CpuHasAvx512Bf16();
bool CpuHasAmxBf16();  // CPUID, XCR0 tile state, and the kernel's permission
bool CpuHasArmBf16();

}  // namespace native
}  // namespace headsum

#endif  // HEADSUM_KERNELS_NATIVE_NATIVE_H_
