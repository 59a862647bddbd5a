// softmax_v: O_h = softmax(S_h) V_g, along the keys, stable (subtracts the
// row max).  Keys masked by the shape's causal flag are excluded whatever S
// holds; a row that sees no finite score gives zeros, never NaN.
//   einsum 'bhqk,bgkd->bhqd' after the softmax.

#if defined(HEADSUM_KERNELS_SOFTMAX_V_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_SOFTMAX_V_INL_H_
#undef HEADSUM_KERNELS_SOFTMAX_V_INL_H_
#else
#define HEADSUM_KERNELS_SOFTMAX_V_INL_H_
#endif

#include <stddef.h>

#include <limits>

#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Floats of scratch SoftmaxWeightedSumV needs: one tile of probability rows.
inline size_t SoftmaxVScratch(const AttnDims& a) { return kTileRows * a.seq_kv; }

// p[0..n) = exp(s - max) over the visible scores, zeros up to `width`;
// returns 1 / sum, or 0 when the row sees no finite score.
HWY_INLINE float SoftmaxNumerators(const float* HWY_RESTRICT s, size_t visible,
                                   size_t width, float* HWY_RESTRICT p) {
  const float max = RowMax(s, visible);
  float inv_sum = 0.0f;
  if (max == -std::numeric_limits<float>::infinity()) {
    Fill(p, visible, 0.0f);  // fully masked row: zeros, not exp(-inf + inf)
  } else {
    inv_sum = 1.0f / ExpShiftedRow(s, visible, max, p);
  }
  Fill(p + visible, width - visible, 0.0f);
  return inv_sum;
}

// Output rows [i0, i1) of head (b, h).  scratch: SoftmaxVScratch().
inline void SoftmaxWeightedSumVRows(const AttnDims& a, const float* HWY_RESTRICT scores,
                                    const float* HWY_RESTRICT v, float* HWY_RESTRICT out,
                                    size_t b, size_t h, size_t i0, size_t i1,
                                    float* HWY_RESTRICT scratch) {
  const size_t L = a.head_dim, Skv = a.seq_kv;
  const size_t g = h / a.group();
  const float* HWY_RESTRICT s_h = scores + ((b * a.heads + h) * a.seq_q) * Skv;
  const float* HWY_RESTRICT v_g = v + ((b * a.kv_heads + g) * Skv) * L;
  float* HWY_RESTRICT o_h = out + ((b * a.heads + h) * a.seq_q) * L;
  float* HWY_RESTRICT p = scratch;  // [kTileRows][width]
  float inv_sum[kTileRows];

  for (size_t r0 = i0; r0 < i1; r0 += kTileRows) {
    const size_t rows = i1 - r0 < kTileRows ? i1 - r0 : kTileRows;
    const size_t width = a.visible_keys(r0 + rows - 1);
    for (size_t r = 0; r < rows; ++r) {
      inv_sum[r] = SoftmaxNumerators(s_h + (r0 + r) * Skv, a.visible_keys(r0 + r), width,
                                     p + r * width);
    }
    // O[i][:] = (sum_j p[i][j] V[j][:]) / sum_j p[i][j]
    MatMul(rows, L, width, p, width, v_g, L, [&](auto d, size_t r, size_t c, auto acc) {
      hn::StoreU(hn::Mul(acc, hn::Set(d, inv_sum[r])), d, o_h + (r0 + r) * L + c);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_SOFTMAX_V_INL_H_
