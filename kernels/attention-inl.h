// attention: O_h = softmax(scale Q_h K_g^T + mask) V_g without materializing
// the scores: flash-style online softmax over tiles of keys.  Per query row
// the running max m, running denominator l and unnormalized output acc obey,
// for each key tile T:
//   m' = max(m, max_{j in T} s_j)
//   acc = acc * exp(m - m') + sum_{j in T} exp(s_j - m') V_j
//   l   = l   * exp(m - m') + sum_{j in T} exp(s_j - m')
// and O = acc / l at the end (zeros when the row sees no key).

#if defined(HEADSUM_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_INL_H_
#endif

#include <stddef.h>

#include <cmath>
#include <limits>

#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Keys per tile: K^T tile L x 128 (32 KiB at L = 64) and the score tile of
// the query rows stay in L1/L2 while both products run over them.
constexpr size_t kKeyTile = 128;
constexpr size_t kQueryBlock = kAttentionQueryBlock;

struct FlashScratch {
  float* k_t;     // [L][kKeyTile]
  float* s;       // [kQueryBlock][kKeyTile] scores, then probabilities
  float* acc;     // [kQueryBlock][L]
  float* m;       // [kQueryBlock] running max
  float* l;       // [kQueryBlock] running denominator
};

inline size_t AttentionScratch(const AttnDims& a) {
  return a.head_dim * kKeyTile + kQueryBlock * kKeyTile + kQueryBlock * a.head_dim +
         2 * kQueryBlock;
}

inline FlashScratch CarveFlashScratch(const AttnDims& a, float* scratch) {
  FlashScratch f;
  f.k_t = scratch;
  f.s = f.k_t + a.head_dim * kKeyTile;
  f.acc = f.s + kQueryBlock * kKeyTile;
  f.m = f.acc + kQueryBlock * a.head_dim;
  f.l = f.m + kQueryBlock;
  return f;
}

// Per query row, what a range of keys leaves behind when the keys are split
// across work items: the unnormalized output, the max and the denominator.
inline size_t PartialFloats(const AttnDims& a) { return a.head_dim + 2; }

// Query rows [i0, i1) of head (b, h), i1 - i0 <= kQueryBlock, over keys
// [key_begin, key_end).  With partial == nullptr the rows are final and go
// to out; otherwise each row's (acc[L], m, l) goes to partial[r] for
// MergeKeySplits.
inline void FlashAttentionRows(const AttnDims& a, const float* HWY_RESTRICT q,
                               const float* HWY_RESTRICT k, const float* HWY_RESTRICT v,
                               float* HWY_RESTRICT out, size_t b, size_t h, size_t i0,
                               size_t i1, size_t key_begin, size_t key_end,
                               float* HWY_RESTRICT partial, float* HWY_RESTRICT scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr float kPosInf = std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, Skv = a.seq_kv, rows = i1 - i0;
  const size_t g = h / a.group();
  const float* HWY_RESTRICT q_blk = q + ((b * a.heads + h) * a.seq_q + i0) * L;
  const float* HWY_RESTRICT k_g = k + ((b * a.kv_heads + g) * Skv) * L;
  const float* HWY_RESTRICT v_g = v + ((b * a.kv_heads + g) * Skv) * L;
  float* HWY_RESTRICT o_blk = out + ((b * a.heads + h) * a.seq_q + i0) * L;
  const FlashScratch f = CarveFlashScratch(a, scratch);
  const float scale = a.scale;

  Fill(f.acc, rows * L, 0.0f);
  Fill(f.m, rows, kNegInf);
  Fill(f.l, rows, 0.0f);

  const size_t last_visible = a.visible_keys(i1 - 1);
  const size_t keys_needed = last_visible < key_end ? last_visible : key_end;
  for (size_t j0 = key_begin; j0 < keys_needed; j0 += kKeyTile) {
    const size_t nj = keys_needed - j0 < kKeyTile ? keys_needed - j0 : kKeyTile;
    Transpose(k_g + j0 * L, nj, L, L, f.k_t, kKeyTile);

    // s[i][j] = scale * Q[i] . K[j0 + j], in 6-row tiles up to what they see.
    size_t first_row = rows;  // first row of the block that sees this tile
    for (size_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const size_t tile_rows = rows - r0 < kTileRows ? rows - r0 : kTileRows;
      const size_t visible = a.visible_keys(i0 + r0 + tile_rows - 1);
      if (visible <= j0) continue;
      if (first_row == rows) first_row = r0;
      const size_t cols = visible - j0 < nj ? visible - j0 : nj;
      MatMul(tile_rows, cols, L, q_blk + r0 * L, L, f.k_t, kKeyTile,
             [&](auto d, size_t r, size_t c, auto acc) {
               hn::StoreU(hn::Mul(acc, hn::Set(d, scale)), d, f.s + (r0 + r) * kKeyTile + c);
             });
    }
    if (first_row == rows) continue;

    // Online softmax update of each row, then acc += P V[j0 .. j0 + nj),
    // each row over the keys it sees only.
    size_t keys[kQueryBlock];
    for (size_t r = first_row; r < rows; ++r) {
      const size_t visible = a.visible_keys(i0 + r);
      const size_t seen = visible <= j0 ? 0 : (visible - j0 < nj ? visible - j0 : nj);
      keys[r - first_row] = seen;
      float* HWY_RESTRICT p = f.s + r * kKeyTile;
      if (std::isnan(f.m[r])) {  // already NaN: stays NaN
        Fill(p, seen, 0.0f);
        continue;
      }
      const float tile_max = RowMax(p, seen);
      if (!(tile_max < kPosInf)) {  // a NaN or +inf score: the row is NaN (IEEE)
        f.m[r] = f.l[r] = std::numeric_limits<float>::quiet_NaN();
        Fill(p, seen, 0.0f);
        continue;
      }
      const float m_new = HWY_MAX(f.m[r], tile_max);
      if (m_new == kNegInf) {  // nothing finite seen yet: acc and l stay 0
        Fill(p, seen, 0.0f);
        continue;
      }
      const float correction = f.m[r] == kNegInf ? 0.0f : std::exp(f.m[r] - m_new);
      const float tile_sum = ExpShiftedRow(p, seen, m_new, p);
      f.l[r] = f.l[r] * correction + tile_sum;
      f.m[r] = m_new;
      if (correction != 1.0f) ScaleRow(f.acc + r * L, L, correction);
    }
    WeightedSumRagged(rows - first_row, L, f.s + first_row * kKeyTile, kKeyTile, keys,
                      v_g + j0 * L, f.acc + first_row * L, L, /*accumulate=*/true);
  }

  if (partial != nullptr) {
    const size_t stride = PartialFloats(a);
    for (size_t r = 0; r < rows; ++r) {
      float* HWY_RESTRICT rec = partial + r * stride;
      const float* HWY_RESTRICT acc_r = f.acc + r * L;
      ForEachVector(L, [&](auto d, size_t c) { hn::StoreU(hn::LoadU(d, acc_r + c), d, rec + c); });
      rec[L] = f.m[r];
      rec[L + 1] = f.l[r];
    }
    return;
  }
  // O = acc / l; rows that saw no key give zeros.
  for (size_t r = 0; r < rows; ++r) {
    // l > 0: normal; l NaN: the row is NaN; l = 0: saw no key, zeros.
    const float inv = f.l[r] > 0.0f || std::isnan(f.l[r]) ? 1.0f / f.l[r] : 0.0f;
    const float* HWY_RESTRICT acc_r = f.acc + r * L;
    float* HWY_RESTRICT o_r = o_blk + r * L;
    ForEachVector(L, [&](auto d, size_t c) {
      hn::StoreU(hn::Mul(hn::LoadU(d, acc_r + c), hn::Set(d, inv)), d, o_r + c);
    });
  }
}

// Combines the partials of `splits` key ranges (in their order, so the result
// does not depend on which thread ran which range) into rows [i0, i1):
//   M = max_c m_c,  O = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c
// partials: [splits][i1 - i0][PartialFloats()].
inline void MergeKeySplits(const AttnDims& a, const float* HWY_RESTRICT partials,
                           size_t splits, float* HWY_RESTRICT out, size_t b, size_t h,
                           size_t i0, size_t i1) {
  const size_t L = a.head_dim, rows = i1 - i0, stride = PartialFloats(a);
  float* HWY_RESTRICT o_blk = out + ((b * a.heads + h) * a.seq_q + i0) * L;
  for (size_t r = 0; r < rows; ++r) {
    float m_all = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (size_t c = 0; c < splits; ++c) {
      const float m = partials[(c * rows + r) * stride + L];
      nan |= std::isnan(m);
      m_all = HWY_MAX(m_all, m);
    }
    float* HWY_RESTRICT o_r = o_blk + r * L;
    Fill(o_r, L, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    if (nan) continue;
    if (m_all == -std::numeric_limits<float>::infinity()) continue;  // saw no key
    float l_all = 0.0f;
    for (size_t c = 0; c < splits; ++c) {
      const float* HWY_RESTRICT rec = partials + (c * rows + r) * stride;
      if (rec[L] == -std::numeric_limits<float>::infinity()) continue;
      const float weight = std::exp(rec[L] - m_all);
      l_all += weight * rec[L + 1];
      ForEachVector(L, [&](auto d, size_t i) {
        hn::StoreU(hn::MulAdd(hn::Set(d, weight), hn::LoadU(d, rec + i), hn::LoadU(d, o_r + i)),
                   d, o_r + i);
      });
    }
    ScaleRow(o_r, L, 1.0f / l_all);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_INL_H_
