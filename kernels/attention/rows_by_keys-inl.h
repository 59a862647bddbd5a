// Rows by keys: 4 to N/2 query rows (N the float lanes of the target) with
// the keys along the lanes: per key tile, K^T packed with the scale folded
// in, S = Q K^T row-major, the online softmax along each row, and a
// register-tiled P V.  Wins where a block of query lanes would be mostly
// padding and the rows do not all see the same keys (a causal short block).

#if defined(HEADSUM_KERNELS_ATTENTION_ROWS_BY_KEYS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_ROWS_BY_KEYS_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_ROWS_BY_KEYS_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_ROWS_BY_KEYS_INL_H_
#endif

#include "kernels/attention/common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Query rows [i0, i0 + rows) over keys [key_begin, key_end) when they are
// too few to fill the lanes (grouped query heads of a decode step, a short
// prefill): the keys run along the lanes instead.  Per key tile, K^T is
// packed with the scale folded in, S = Q K^T comes out row-major, the online
// softmax runs along each row, and P V is the register-tiled product that
// reads each value row once per tile for all the rows.  Rows of S are
// kKeyTile apart, in s_t.
inline void FlashAttentionRowsByKeys(const AttnDims& a, const float* HWY_RESTRICT q_blk,
                                     size_t ldq, const KvRows& k_g, const KvRows& v_g,
                                     size_t b, size_t h, size_t i0, size_t rows,
                                     size_t key_begin, size_t key_end, const FlashScratch& f) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, ld = kKeyTile;
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  const float scale2 = Base2Scale(a);
  const size_t last_visible = a.visible_keys(i0 + rows - 1);
  const size_t keys_needed = last_visible < key_end ? last_visible : key_end;
  size_t keys[kQueryBlock];
  // The first tile writes acc (no scaling of zeros by corr = 0, no fill).
  bool first = true;
  for (size_t j0 = key_begin; j0 < keys_needed; j0 += kKeyTile) {
    const size_t nj = keys_needed - j0 < kKeyTile ? keys_needed - j0 : kKeyTile;
    const size_t cols = RoundUpToVectors(nj, N);  // whole vectors; K^T is zero past nj
    PrefetchNextTiles(k_g, v_g, j0 + nj, keys_needed, L);
    size_t ldk;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    TransposeScaledPadded(k_tile, nj, L, ldk, scale2, f.k_t, ld, cols);
    // S[r][j] = (scale log2(e) K[j0 + j]) . Q[i0 + r]
    MatMul(rows, cols, L, q_blk, ldq, f.k_t, ld, [&](auto d, size_t r, size_t c, auto acc) {
      hn::StoreU(acc, d, f.s_t + r * ld + c);
    });
    for (size_t r = 0; r < rows; ++r) {
      const size_t visible = a.visible_keys(i0 + r);
      keys[r] = visible <= j0 ? 0 : (visible - j0 < nj ? visible - j0 : nj);
      float* HWY_RESTRICT s_r = f.s_t + r * ld;
      if (AddsToScores(a)) AddRowExtras(ExtrasOf(a, b, h, i0 + r), j0, keys[r], s_r);
      if (a.window != 0) {  // keys before the row's window
        const size_t first = a.first_key(i0 + r);
        const size_t before = first <= j0 ? 0 : HWY_MIN(first - j0, keys[r]);
        for (size_t j = 0; j < before; ++j) s_r[j] = kNegInf;
      }
      const float tile_max = RowMax(s_r, keys[r]);  // -inf for no key
      if (!(tile_max < -kNegInf)) f.bad[r] = 1.0f;   // NaN or +inf
      const float m_new = HWY_MAX(f.m[r], tile_max);
      // Rows that have seen nothing finite shift by 0: 2^(-inf - 0) = 0.
      const float shift = m_new == kNegInf ? 0.0f : m_new;
      const float corr = f.m[r] == kNegInf ? 0.0f : std::exp2(f.m[r] - shift);
      const float sum = ExpShiftedRow</*kBase2=*/true>(s_r, keys[r], shift, s_r);
      f.l[r] = f.l[r] * corr + sum;
      f.m[r] = m_new;
      if (!first && corr != 1.0f) ScaleRow(f.acc + r * L, L, corr);
    }
    // acc[r] (+)= sum_{j < keys[r]} P[r][j] V[j0 + j]
    size_t ldv;
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    WeightedSumRagged(rows, L, f.s_t, ld, 1, keys, v_tile, ldv, f.acc, L,
                      /*accumulate=*/!first);
    first = false;
  }
  if (first) Fill(f.acc, rows * L, 0.0f);
}

// The rows-by-keys path.
HWY_NOINLINE void AttentionRowsByKeysBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                           size_t h, size_t i0, size_t i1, size_t key_begin,
                                           size_t key_end, float* HWY_RESTRICT partial,
                                           float* HWY_RESTRICT scratch) {
  const Block blk = StartBlock(a, views, b, h, i0, i1, scratch);
  FlashAttentionRowsByKeys(a, blk.q, blk.ldq, blk.k, blk.v, b, h, i0, blk.rows, key_begin,
                           key_end, blk.f);
  EndBlock(a, blk, partial);
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_ROWS_BY_KEYS_INL_H_
