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

#include "hwy/cache_control.h"
#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// The register tile of the score product: 6 x 4 vectors on 32-register
// targets (64 keys on AVX-512: 512 keys are 8 whole panels), else 6 x 2.
constexpr size_t kQkRows = kTileRows;
constexpr size_t kQkVecs = kPvVecs;

// Keys packed per step: K^T for kKeyChunk keys (L x 64 floats, 16 KiB at
// L = 64) stays in L1 while every query row of the item passes it, cut into
// panels of one register tile's columns (64 = 1 x 64 on AVX-512, 4 x 16 on
// AVX2...).
constexpr size_t kKeyChunk = 64;

// Floats of scratch QDotKRows needs.
inline size_t QkScoresScratch(const AttnDims& a) { return a.head_dim * kKeyChunk; }

// out[r][c] = sum_l q[r][l] k_t[l][c] for rows x cols (q row stride L, k_t
// row stride ldk, out row stride ldo).  Kept out of line: inlined into
// QDotKRows, GCC 12 spills the B vectors of the register tile to the stack.
// kStream: full, aligned vectors go out with non-temporal stores (never a
// partial one: x86's Stream of a 1-lane vector writes a whole 128 bits).
template <bool kStream>
inline HWY_NOINLINE void ScoreTile(size_t rows, size_t cols, size_t L, const float* HWY_RESTRICT q,
                            const float* HWY_RESTRICT k_t, size_t ldk, float* HWY_RESTRICT out,
                            size_t ldo) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  MatMul<kQkRows, kQkVecs>(rows, cols, L, q, L, k_t, ldk,
                           [&](auto d, size_t r, size_t c, auto acc) {
                             float* HWY_RESTRICT dst = out + r * ldo + c;
                             if (kStream && hn::Lanes(d) == N &&
                                 reinterpret_cast<uintptr_t>(dst) % (N * sizeof(float)) == 0) {
                               hn::Stream(acc, d, dst);
                             } else {
                               hn::StoreU(acc, d, dst);
                             }
                           });
}

// The last n < N columns of a panel as one vector: k_t is zero-padded to a
// whole vector, the n real lanes are stored.  One pass over L instead of one
// per column.
inline HWY_NOINLINE void ScoreTileTail(size_t rows, size_t n, size_t L,
                                       const float* HWY_RESTRICT q,
                                       const float* HWY_RESTRICT k_t, size_t ldk,
                                       float* HWY_RESTRICT out, size_t ldo) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  MatMul<kQkRows, 1>(rows, N, L, q, L, k_t, ldk, [&](auto d, size_t r, size_t c, auto acc) {
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(acc, d, lanes);
    float* HWY_RESTRICT dst = out + r * ldo + c;
    for (size_t i = 0; i < n; ++i) dst[i] = lanes[i];
  });
}

// Scores of query rows [i0, i1) of head (b, h).  scratch: QkScoresScratch().
// stream: write full aligned vectors with non-temporal stores (for score
// tensors far larger than the caches: no line is read for ownership only to
// be overwritten).
//   S[i][j] = scale * sum_l Q[i][l] K[j][l]      (j visible from i)
//   S[i][j] = -inf                               (j masked)
// K^T is packed chunk by chunk in panels of P keys (P = the register tile's
// columns), each [L][P] contiguous, so the tile reads B with unit stride;
// each row tile writes its scores for the whole chunk at once.
inline void QDotKRows(const AttnDims& a, const float* HWY_RESTRICT q,
                      const float* HWY_RESTRICT k, float* HWY_RESTRICT scores, size_t b,
                      size_t h, size_t i0, size_t i1, bool stream, float* HWY_RESTRICT scratch) {
  const size_t L = a.head_dim, Skv = a.seq_kv;
  const size_t g = h / a.group();
  const float* HWY_RESTRICT q_h = q + ((b * a.heads + h) * a.seq_q) * L;
  const float* HWY_RESTRICT k_g = k + ((b * a.kv_heads + g) * Skv) * L;
  float* HWY_RESTRICT s_h = scores + ((b * a.heads + h) * a.seq_q) * Skv;
  const size_t keys_needed = a.visible_keys(i1 - 1);  // the last row sees the most
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t P = kQkVecs * N;  // keys per panel
  const float scale = a.scale;
  const auto score_tile = stream ? &ScoreTile<true> : &ScoreTile<false>;

  // Streamed rows that all start at the same distance from a vector
  // boundary (Skv a whole number of vectors) begin with a chunk of the keys
  // up to that boundary (a tail tile, regular stores), so that every later
  // vector is aligned and goes out non-temporal: otherwise, scores 16 bytes
  // off as std::vector gives them, none would, and each line would be read
  // for ownership before it is overwritten (Zen 4 VM, H=8 S=2048 L=64, one
  // thread: 0.70-0.74 of the aligned speed, oneDNN 1.02-1.05).  Every score
  // is one FMA chain over l whatever tile computes it: the same bits.
  size_t first_chunk = kKeyChunk;
  if (stream && Skv % N == 0) {
    const size_t vec_bytes = N * sizeof(float);
    const size_t off = reinterpret_cast<uintptr_t>(s_h) % vec_bytes;
    if (off != 0 && off % sizeof(float) == 0) first_chunk = (vec_bytes - off) / sizeof(float);
  }
  for (size_t j0 = 0, nj = 0; j0 < keys_needed; j0 += nj) {
    const size_t chunk = j0 == 0 ? first_chunk : kKeyChunk;
    nj = keys_needed - j0 < chunk ? keys_needed - j0 : chunk;
    // Panel p of the chunk: keys j0 + p .. j0 + p + width - 1, at scratch + p L,
    // rows of RoundUp(width, N) floats (zeros past the last key).
    for (size_t p = 0; p < nj; p += P) {
      const size_t width = nj - p < P ? nj - p : P;
      const size_t padded = RoundUpToVectors(width, N);
      TransposeScaledPadded(k_g + (j0 + p) * L, width, L, L, scale, scratch + p * L, padded,
                            padded);
    }
    for (size_t r0 = i0; r0 < i1; r0 += kQkRows) {
      const size_t rows = i1 - r0 < kQkRows ? i1 - r0 : kQkRows;
      const size_t visible = a.visible_keys(r0 + rows - 1);
      for (size_t p = 0; p < nj && j0 + p < visible; p += P) {
        const size_t key0 = j0 + p;
        const size_t width = nj - p < P ? nj - p : P;
        // On the causal diagonal, whole vectors: the few masked scores this
        // computes are overwritten with -inf below.
        const size_t needed = RoundUpToVectors(visible - key0, N);
        const size_t cols = needed < width ? needed : width;
        const size_t full = cols / N * N, ldk = RoundUpToVectors(width, N);
        const float* HWY_RESTRICT panel = scratch + p * L;
        float* HWY_RESTRICT out = s_h + r0 * Skv + key0;
        if (full > 0) score_tile(rows, full, L, q_h + r0 * L, panel, ldk, out, Skv);
        if (cols > full) {
          ScoreTileTail(rows, cols - full, L, q_h + r0 * L, panel + full, ldk, out + full, Skv);
        }
      }
    }
  }
  if (stream) hwy::FlushStream();  // order the non-temporal stores before the return
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
