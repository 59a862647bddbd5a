// Prefill tiles: a block of up to kQueryBlock query rows over 128-key tiles,
// computing the transposed scores S^T = K_T (scale Q)^T: K read in place as
// the broadcast operand (no K^T packing per tile), queries along the vector
// lanes, so the max, the exponentials and the denominators of all rows are
// vector operations down the keys, and P V reads P^T with a column stride.
// The path for prefill and chunked prefill (and any block too wide for the
// others).

#if defined(HEADSUM_KERNELS_ATTENTION_PREFILL_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_PREFILL_TILES_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_PREFILL_TILES_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_PREFILL_TILES_INL_H_
#endif

#include "kernels/attention/common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// The prefill-tiles path: query rows [i0, i1) of head (b, h),
// i1 - i0 <= kQueryBlock, over keys [key_begin, key_end).  With partial ==
// nullptr the rows are final and go to out; otherwise each row's (acc[L],
// m, l) goes to partial[r] for MergeKeySplits.
HWY_NOINLINE void AttentionTilesBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                      size_t h, size_t i0, size_t i1, size_t key_begin,
                                      size_t key_end, float* HWY_RESTRICT partial,
                                      float* HWY_RESTRICT scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const Block blk = StartBlock(a, views, b, h, i0, i1, scratch);
  const FlashScratch& f = blk.f;
  const KvRows& k_g = blk.k;
  const KvRows& v_g = blk.v;
  const float* HWY_RESTRICT q_blk = blk.q;
  const size_t L = a.head_dim, rows = blk.rows, ldq = blk.ldq;
  const size_t ldw = f.ldw, cols = QueryColumns(rows);
  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());

  // q_t[l][r] = scale log2(e) Q[i0 + r][l]; padding columns stay 0 (finite
  // scores in lanes no row reads).
  // (4 x 4 blocks in registers: element by element this was 14% of an
  // S=20 call on AVX2.)
  const float scale2 = Base2Scale(a);
  TransposeScaledPadded(q_blk, rows, L, ldq, scale2, f.q_t, ldw, cols);

  const bool extras = AddsToScores(a);
  if (extras) BlockExtrasSetUp(a, blk);
  const size_t last_visible = a.visible_keys(i1 - 1);
  const size_t keys_needed = last_visible < key_end ? last_visible : key_end;
  size_t keys[kQueryBlock];
  // The first tile writes acc: no fill, and no scaling of zeros by its
  // corrections (2^-inf = 0): 4% of an S=20 call.
  bool first = true;
  for (size_t j0 = key_begin; j0 < keys_needed; j0 += kKeyTile) {
    const size_t nj = keys_needed - j0 < kKeyTile ? keys_needed - j0 : kKeyTile;
    PrefetchNextTiles(k_g, v_g, j0 + nj, keys_needed, L);
    // S^T[j][r] = K[j0 + j] . (scale log2(e) Q[i0 + r])
    size_t ldk;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const auto store_s = [&](auto d, size_t j, size_t c, auto acc) {
      hn::StoreU(acc, d, f.s_t + j * ldw + c);
    };
    // Three vectors of query lanes (17-24 rows on AVX2, the seed's 20): 4 x 3
    // tiles, 3 loads and 4 broadcasts per 12 FMAs, instead of a 6 x 2 tile
    // and a 6 x 1 one (7 loads per 6 FMAs).  Not compiled for SCALAR's
    // one-vector tiles.
    bool tiled_4x3 = false;
    if constexpr (kTileVecs == 2) {
      if (cols == 3 * lanes) {
        MatMul<4, 3>(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
        tiled_4x3 = true;
      }
    }
    // AVX-512 (32 registers): 6 x 4 tiles, the 64 query lanes of a full
    // block at once, 10 loads per 24 FMAs instead of 8 per 12; the same
    // bits (each score is one FMA chain whatever the tile).  Paired runs
    // alternated with 6 x 2 on the Sapphire Rapids VM (B=1 H=8 L=64, 10-20
    // rounds, medians of the per-round ratios): S=512 one thread 0.955x the
    // time, S=2048 0.971x, S=2048 two threads 0.950x.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (!tiled_4x3) MatMul<kTileRows, 4>(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
#else
    if (!tiled_4x3) MatMul(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
#endif
    if (extras) AddTileExtras(a, blk, j0, nj, f.s_t, ldw);
    // Keys of this tile each row sees; on the causal diagonal the rest are
    // -inf, as are those before a sliding window.
    for (size_t r = 0; r < rows; ++r) {
      const size_t visible = a.visible_keys(i0 + r);
      keys[r] = visible <= j0 ? 0 : (visible - j0 < nj ? visible - j0 : nj);
      for (size_t j = keys[r]; j < nj; ++j) f.s_t[j * ldw + r] = kNegInf;
      if (a.window != 0) {
        const size_t first = a.first_key(i0 + r);
        const size_t before = first <= j0 ? 0 : HWY_MIN(first - j0, keys[r]);
        for (size_t j = 0; j < before; ++j) f.s_t[j * ldw + r] = kNegInf;
      }
    }

    // Online softmax down the keys, all query rows at once along the lanes.
    const hn::ScalableTag<float> d;
    const size_t N = hn::Lanes(d);
    const auto neg_inf = hn::Set(d, kNegInf), pos_inf = hn::Set(d, -kNegInf);
    // Four keys per step, each with its own max, flag and sum: the chains
    // of Max and Add would otherwise bound the loops by their latency.
    for (size_t c = 0; c < cols; c += N) {
      const float* HWY_RESTRICT s_c = f.s_t + c;
      const auto m_old = hn::LoadU(d, f.m + c);
      auto max0 = neg_inf, max1 = neg_inf, max2 = neg_inf, max3 = neg_inf;
      // Lanes whose row has seen no NaN or +inf: one chain of And (latency
      // 1) is enough.  With four, as the maxima have, GCC spilled two of
      // them on AVX2 and the loop ran at the store-to-load latency.
      auto ok = hn::Eq(hn::LoadU(d, f.bad + c), hn::Zero(d));
      const auto see = [&](auto& max, size_t j) {
        const auto s = hn::LoadU(d, s_c + j * ldw);
        max = hn::Max(max, s);
        ok = hn::And(ok, hn::Lt(s, pos_inf));
      };
      size_t j = 0;
      for (; j + 4 <= nj; j += 4) {
        see(max0, j);
        see(max1, j + 1);
        see(max2, j + 2);
        see(max3, j + 3);
      }
      for (; j < nj; ++j) see(max0, j);
      const auto tile_max = hn::Max(hn::Max(max0, max1), hn::Max(max2, max3));
      const auto bad = hn::Not(ok);
      const auto m_new = hn::Max(m_old, tile_max);
      // Rows that have seen nothing finite shift by 0: exp(-inf - 0) = 0.
      const auto shift = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      const auto corr = Exp2NonPositive(d, hn::Sub(m_old, shift));
      auto sum0 = hn::Zero(d), sum1 = hn::Zero(d), sum2 = hn::Zero(d), sum3 = hn::Zero(d);
      const auto weigh = [&](auto& sum, size_t j) {
        float* HWY_RESTRICT p = f.s_t + j * ldw + c;
        const auto e = Exp2NonPositive(d, hn::Sub(hn::LoadU(d, p), shift));
        hn::StoreU(e, d, p);
        sum = hn::Add(sum, e);
      };
      for (j = 0; j + 4 <= nj; j += 4) {
        weigh(sum0, j);
        weigh(sum1, j + 1);
        weigh(sum2, j + 2);
        weigh(sum3, j + 3);
      }
      for (; j < nj; ++j) weigh(sum0, j);
      const auto sum = hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3));
      hn::StoreU(m_new, d, f.m + c);
      hn::StoreU(hn::MulAdd(hn::LoadU(d, f.l + c), corr, sum), d, f.l + c);
      hn::StoreU(corr, d, f.corr + c);
      hn::StoreU(hn::IfThenElseZero(bad, hn::Set(d, 1.0f)), d, f.bad + c);
    }
    for (size_t r = 0; r < rows && !first; ++r) {
      if (f.corr[r] != 1.0f) ScaleRow(f.acc + r * L, L, f.corr[r]);
    }
    // acc[r] (+)= sum_{j < keys[r]} P^T[j][r] V[j0 + j]
    size_t ldv;
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    WeightedSumRagged(rows, L, f.s_t, 1, ldw, keys, v_tile, ldv, f.acc, L,
                      /*accumulate=*/!first);
    first = false;
  }
  if (first) Fill(f.acc, rows * L, 0.0f);
  EndBlock(a, blk, partial);
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_PREFILL_TILES_INL_H_
