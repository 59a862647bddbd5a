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

// p[0..visible) = exp(s - max) over the visible scores; returns 1 / sum,
// 0 when the row sees no finite score, NaN when it sees a NaN or +inf score
// (IEEE: exp(inf - inf) is NaN; the row becomes NaN, as in the reference).
HWY_INLINE float SoftmaxNumerators(const float* HWY_RESTRICT s, size_t visible,
                                   float* HWY_RESTRICT p) {
  const float max = RowMax(s, visible);
  if (max == -std::numeric_limits<float>::infinity()) return 0.0f;  // fully masked
  if (!(max < std::numeric_limits<float>::infinity())) {            // NaN or +inf
    Fill(p, visible, 0.0f);
    return std::numeric_limits<float>::quiet_NaN();
  }
  return 1.0f / ExpShiftedRow(s, visible, max, p);
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
  size_t keys[kTileRows];

  for (size_t r0 = i0; r0 < i1; r0 += kTileRows) {
    const size_t rows = i1 - r0 < kTileRows ? i1 - r0 : kTileRows;
    const size_t width = a.visible_keys(r0 + rows - 1);
    for (size_t r = 0; r < rows; ++r) {
      keys[r] = a.visible_keys(r0 + r);
      inv_sum[r] = SoftmaxNumerators(s_h + (r0 + r) * Skv, keys[r], p + r * width);
      if (inv_sum[r] == 0.0f) Fill(p + r * width, keys[r], 0.0f);
    }
    // O[i][:] = (sum_{j visible} p[i][j] V[j][:]) / sum_j p[i][j]
    float* HWY_RESTRICT o_tile = o_h + r0 * L;
    WeightedSumRagged(rows, L, p, width, 1, keys, v_g, L, o_tile, L, /*accumulate=*/false);
    for (size_t r = 0; r < rows; ++r) {
      if (inv_sum[r] == 0.0f) {
        Fill(o_tile + r * L, L, 0.0f);  // sees nothing: zeros, whatever V holds
      } else {
        ScaleRow(o_tile + r * L, L, inv_sum[r]);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_SOFTMAX_V_INL_H_
