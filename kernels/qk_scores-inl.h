// qk_scores: S_h = scale * Q_h K_g^T, -inf where causally masked.
//   einsum 'bhqd,bgkd->bhqk' with g = h / (H / Hkv).

#if defined(HEADSUM_KERNELS_QK_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_QK_SCORES_INL_H_
#undef HEADSUM_KERNELS_QK_SCORES_INL_H_
#else
#define HEADSUM_KERNELS_QK_SCORES_INL_H_
#endif

#include <stddef.h>

#include <limits>

#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Keys per packed K^T panel: L x 256 floats (64 KiB at L = 64) stays in L2
// while every query row of the item streams through it.
constexpr size_t kKeyPanel = 256;

// Floats of scratch QDotKRows needs.
inline size_t QkScoresScratch(const AttnDims& a) { return a.head_dim * kKeyPanel; }

// Scores of query rows [i0, i1) of head (b, h).  scratch: QkScoresScratch().
//   S[i][j] = scale * sum_l Q[i][l] K[j][l]      (j visible from i)
//   S[i][j] = -inf                               (j masked)
inline void QDotKRows(const AttnDims& a, const float* HWY_RESTRICT q,
                      const float* HWY_RESTRICT k, float* HWY_RESTRICT scores, size_t b,
                      size_t h, size_t i0, size_t i1, float* HWY_RESTRICT scratch) {
  const size_t L = a.head_dim, Skv = a.seq_kv;
  const size_t g = h / a.group();
  const float* HWY_RESTRICT q_h = q + ((b * a.heads + h) * a.seq_q) * L;
  const float* HWY_RESTRICT k_g = k + ((b * a.kv_heads + g) * Skv) * L;
  float* HWY_RESTRICT s_h = scores + ((b * a.heads + h) * a.seq_q) * Skv;
  const size_t keys_needed = a.visible_keys(i1 - 1);  // the last row sees the most
  float* HWY_RESTRICT k_t = scratch;                   // [L][kKeyPanel]

  for (size_t j0 = 0; j0 < keys_needed; j0 += kKeyPanel) {
    const size_t nj = keys_needed - j0 < kKeyPanel ? keys_needed - j0 : kKeyPanel;
    Transpose(k_g + j0 * L, nj, L, L, k_t, kKeyPanel);
    for (size_t r0 = i0; r0 < i1; r0 += kTileRows) {
      const size_t rows = i1 - r0 < kTileRows ? i1 - r0 : kTileRows;
      const size_t visible = a.visible_keys(r0 + rows - 1);
      if (visible <= j0) continue;  // every key of this panel is masked here
      const size_t cols = visible - j0 < nj ? visible - j0 : nj;
      const float scale = a.scale;
      MatMul(rows, cols, L, q_h + r0 * L, L, k_t, kKeyPanel,
             [&](auto d, size_t r, size_t c, auto acc) {
               hn::StoreU(hn::Mul(acc, hn::Set(d, scale)), d,
                          s_h + (r0 + r) * Skv + j0 + c);
             });
    }
  }
  // Masked keys (and those past the last computed panel column) are -inf.
  for (size_t i = i0; i < i1; ++i) {
    const size_t visible = a.visible_keys(i);
    Fill(s_h + i * Skv + visible, Skv - visible, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_QK_SCORES_INL_H_
