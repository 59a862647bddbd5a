// AVX-512 code shared by the x86 native paths (avx512_bf16.cc and
// amx_bf16.cc include it; both compile with -mavx512f -mavx512bw -mavx512vl
// -mavx512bf16 ...): reading rows of any dtype as bf16, the packed layouts
// the bf16 products read, the online softmax of a block of scores, and the
// AVX512_BF16 (VDPBF16PS) kernels themselves.  Everything is in an
// anonymous namespace: each including file gets its own copy, compiled with
// its own flags.
//
// Packed layouts (per key block of at most kKeyBlock keys):
//   qp  [rows rounded up to 16][Lp] bf16     Q rows, Lp = L rounded up to 32,
//                                            zero-padded (rows and dims)
//   kt  [Lp/2][kKeyBlock] u32                K^T in pairs: kt[p][j] holds
//                                            K[j][2p] (low half), K[j][2p+1]
//                                            (high half); zero past the keys
//   vp  [kKeyBlock/2][2 Lv] bf16             V in pairs of keys: vp[q][2n+t] =
//                                            V[2q+t][n]; Lv = L rounded up to 16
//   p   [rows][kKeyBlock] bf16               P rounded to bf16, 0 past the keys
// kt is at once the B operand of an AMX Q K^T (a tile: 16 pair rows x 16
// keys) and the broadcast-free operand of VDPBF16PS (one row of 16 keys per
// pair of dims); vp is the B operand of P V for both; p is AMX's A operand
// and, read as u32, VDPBF16PS's broadcast pairs.
#ifndef HEADSUM_KERNELS_NATIVE_X86_BF16_INL_H_
#define HEADSUM_KERNELS_NATIVE_X86_BF16_INL_H_

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <limits>

#include "kernels/native/native.h"

namespace headsum {
namespace native {
namespace {

constexpr size_t kKeyBlock = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }
inline size_t MinSize(size_t a, size_t b) { return a < b ? a : b; }
inline __mmask32 Mask32(size_t n) { return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1; }
inline __mmask16 Mask16(size_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Elements [d0, d0 + n) (n <= 32) of a row of `dtype` as 32 bf16, zeros past n.
inline __m512i Load32Bf16(const char* row, DType dtype, size_t d0, size_t n) {
  switch (dtype) {
    case DType::kBF16:
      return _mm512_maskz_loadu_epi16(Mask32(n), reinterpret_cast<const uint16_t*>(row) + d0);
    case DType::kF32: {
      const float* f = reinterpret_cast<const float*>(row) + d0;
      const __m512 lo = _mm512_maskz_loadu_ps(Mask16(n), f);
      const __m512 hi = n > 16 ? _mm512_maskz_loadu_ps(Mask16(n - 16), f + 16) : _mm512_setzero_ps();
      return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    case DType::kF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + d0;
      const __m512 lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask16(n), h));
      const __m512 hi = n > 16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask16(n - 16), h + 16))
                               : _mm512_setzero_ps();
      return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
  }
  return _mm512_setzero_si512();
}

// Horizontal max and sum (GCC 12's _mm512_reduce_* warn falsely).
inline __m128 Halve(__m512 v, bool max) {
  const __m256 lo = _mm512_castps512_ps256(v), hi = _mm512_extractf32x8_ps(v, 1);
  const __m256 x = max ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  const __m128 a = _mm256_castps256_ps128(x), b = _mm256_extractf128_ps(x, 1);
  return max ? _mm_max_ps(a, b) : _mm_add_ps(a, b);
}
inline float HMax(__m512 v) {
  __m128 x = Halve(v, true);
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
inline float HSum(__m512 v) {
  __m128 x = Halve(v, false);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

// 2^x for x <= 0 (or slightly above 0 by rounding), -inf and NaN: 2^n p(f)
// with n = round(x), f = x - n in [-1/2, 1/2] and p the degree-6 Taylor
// polynomial of 2^f = e^(f ln 2) (truncation < 1.2e-7 relative, about one
// f32 epsilon; Horner adds about one more).  Below -150 the result is 0 (as
// 2^x is then below the smallest subnormal); NaN stays NaN (MAX returns its
// second operand when either is NaN).
inline __m512 Exp2(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5403530393381608e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// n f32 values to dst in `dtype`, as StoreRow (native.h) does: 16-bit
// outputs rounded to nearest even (VCVTNEPS2BF16, VCVTPS2PH).  A vector
// holding an f32 subnormal takes StoreRow (VCVTNEPS2BF16 would flush it).
inline void StoreRowX86(const float* src, size_t n, DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  const __m512 min_normal = _mm512_set1_ps(std::numeric_limits<float>::min());
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = Mask16(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(k, src + i);
    if (dtype == DType::kBF16) {
      const __mmask16 tiny = _mm512_mask_cmp_ps_mask(k, _mm512_abs_ps(x), min_normal, _CMP_LT_OQ) &
                             _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      if (tiny != 0) {
        StoreRow(src + i, MinSize(16, n - i), dtype, d + i);
        continue;
      }
      _mm256_mask_storeu_epi16(d + i, k, (__m256i)_mm512_cvtneps_pbh(x));
    } else {
      _mm256_mask_storeu_epi16(d + i, k, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
}

// ---------------------------------------------------------------------------
// Packing.

// Rows [i0, i0 + rows) of head (b, h) of q into qp (zero-padded to
// RoundUp(rows, 16) rows of Lp).
inline void PackQ(const TensorView& q, size_t b, size_t h, size_t i0, size_t rows, size_t L,
                  size_t Lp, uint16_t* qp) {
  const size_t padded = RoundUp(rows, 16);
  for (size_t r = 0; r < padded; ++r) {
    uint16_t* dst = qp + r * Lp;
    if (r >= rows) {
      memset(dst, 0, Lp * sizeof(uint16_t));
      continue;
    }
    const char* src = q.Row(b, h, i0 + r);
    for (size_t d0 = 0; d0 < Lp; d0 += 32) {
      _mm512_storeu_si512(dst + d0, Load32Bf16(src, q.dtype, d0, d0 < L ? L - d0 : 0));
    }
  }
}

// 16 x 16 transpose of 32-bit elements: out[n] holds element n of in[0..15].
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Per row quad q: u[4q + c] holds, in 128-bit lane k, column 4k + c of
  // rows 4q .. 4q + 3.
  for (int q = 0; q < 4; ++q) {
    const __m512i lo01 = t[4 * q], hi01 = t[4 * q + 1], lo23 = t[4 * q + 2], hi23 = t[4 * q + 3];
    u[4 * q + 0] = _mm512_unpacklo_epi64(lo01, lo23);
    u[4 * q + 1] = _mm512_unpackhi_epi64(lo01, lo23);
    u[4 * q + 2] = _mm512_unpacklo_epi64(hi01, hi23);
    u[4 * q + 3] = _mm512_unpackhi_epi64(hi01, hi23);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// Keys [j0, j0 + nj) of kv head (b, g) into kt (pairs of dims [0, Lp/2)
// rows, keys rounded up to 16, zeros past nj and past L).
inline void PackKT(const TensorView& k, size_t b, size_t g, size_t j0, size_t nj, size_t L,
                   size_t Lp, uint32_t* kt) {
  for (size_t t = 0; t < nj; t += 16) {
    const size_t keys = MinSize(16, nj - t);
    for (size_t d0 = 0; d0 < Lp; d0 += 32) {
      __m512i r[16];
      const size_t n = d0 < L ? MinSize(32, L - d0) : 0;
      for (size_t i = 0; i < 16; ++i) {
        r[i] = i < keys ? Load32Bf16(k.Row(b, g, j0 + t + i), k.dtype, d0, n)
                        : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      uint32_t* dst = kt + (d0 / 2) * kKeyBlock + t;
      for (size_t p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * kKeyBlock, r[p]);
    }
  }
}

// Keys [j0, j0 + nj) of kv head (b, g) into vp (pairs of keys, rounded up
// to 16 pairs, zeros past nj).  Returns whether any of the nj rows holds an
// inf or NaN (as bf16): then P V must not multiply a masked key's 0 by it.
inline bool PackVPairs(const TensorView& v, size_t b, size_t g, size_t j0, size_t nj, size_t L,
                       size_t Lv, uint16_t* vp) {
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  const __m512i exp_mask = _mm512_set1_epi16(0x7F80);
  __mmask32 nonfinite = 0;
  const size_t pairs = RoundUp(nj, 32) / 2;
  for (size_t q = 0; q < pairs; ++q) {
    uint16_t* dst = vp + q * 2 * Lv;
    const size_t j = 2 * q;
    if (j >= nj) {
      memset(dst, 0, 2 * Lv * sizeof(uint16_t));
      continue;
    }
    const char* row0 = v.Row(b, g, j0 + j);
    const char* row1 = j + 1 < nj ? v.Row(b, g, j0 + j + 1) : nullptr;
    // The rows 16 keys ahead: V streams from L3 or memory in a decode.
    const size_t row_bytes = L * DTypeBytes(v.dtype);
    for (size_t at = 0; at < row_bytes; at += 64) {
      _mm_prefetch(v.Row(b, g, j0 + j + 16) + at, _MM_HINT_T0);
      _mm_prefetch(v.Row(b, g, j0 + j + 17) + at, _MM_HINT_T0);
    }
    for (size_t d0 = 0; d0 < Lv; d0 += 32) {
      const size_t n = d0 < L ? MinSize(32, L - d0) : 0;
      const __m512i a = Load32Bf16(row0, v.dtype, d0, n);
      const __m512i c = row1 ? Load32Bf16(row1, v.dtype, d0, n) : _mm512_setzero_si512();
      nonfinite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(a, exp_mask), exp_mask);
      nonfinite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, exp_mask), exp_mask);
      _mm512_storeu_si512(dst + 2 * d0, _mm512_permutex2var_epi16(a, lo_idx, c));
      if (d0 + 16 < Lv) _mm512_storeu_si512(dst + 2 * d0 + 32, _mm512_permutex2var_epi16(a, hi_idx, c));
    }
  }
  return nonfinite != 0;
}

// ---------------------------------------------------------------------------
// Attention: scratch and the per-row online softmax.

struct AttnScratch {
  size_t Lp, Lv;
  size_t b, h;     // the work item's head (for the options' per-row terms)
  uint16_t* qp;    // [kQueryBlock][Lp]
  uint32_t* kt;    // [Lp/2][kKeyBlock]
  uint16_t* vp;    // [kKeyBlock/2][2 Lv]
  float* s;        // [16][kKeyBlock]
  uint16_t* p;     // [16][kKeyBlock]
  float* acc;      // [kQueryBlock][Lv]
  float* m;        // [kQueryBlock]
  float* l;        // [kQueryBlock]
  float* corr;     // [kQueryBlock]
  float* tile;     // [16][Lv]  P V of a 16-row group (AMX)
  float* saved;    // [16][Lv]  rows redone without masked keys
  float* row;      // [Lv]      a finished row before it is stored
};

inline size_t AttnScratchFloats(const AttnDims& a) {
  const size_t Lp = RoundUp(a.head_dim, 32), Lv = RoundUp(a.head_dim, 16);
  return kQueryBlock * Lp / 2 + Lp / 2 * kKeyBlock + kKeyBlock * Lv + 16 * kKeyBlock +
         8 * kKeyBlock + kQueryBlock * Lv + 3 * kQueryBlock + 2 * 16 * Lv + Lv + 16 * 16;
}

inline AttnScratch CarveAttnScratch(const AttnDims& a, float* scratch, size_t b, size_t h) {
  AttnScratch s;
  s.b = b;
  s.h = h;
  s.Lp = RoundUp(a.head_dim, 32);
  s.Lv = RoundUp(a.head_dim, 16);
  float* f = scratch;
  const auto take = [&](size_t floats) {
    float* at = f;
    f += RoundUp(floats, 16);  // 64-byte steps
    return at;
  };
  s.qp = reinterpret_cast<uint16_t*>(take(kQueryBlock * s.Lp / 2));
  s.kt = reinterpret_cast<uint32_t*>(take(s.Lp / 2 * kKeyBlock));
  s.vp = reinterpret_cast<uint16_t*>(take(kKeyBlock * s.Lv));
  s.s = take(16 * kKeyBlock);
  s.p = reinterpret_cast<uint16_t*>(take(8 * kKeyBlock));
  s.acc = take(kQueryBlock * s.Lv);
  s.m = take(kQueryBlock);
  s.l = take(kQueryBlock);
  s.corr = take(kQueryBlock);
  s.tile = take(16 * s.Lv);
  s.saved = take(16 * s.Lv);
  s.row = take(s.Lv);
  return s;
}

// One row's scores s[0, nj) (raw Q K, keys[j] visible for j < visible):
// updates the running max m (base 2) and sum l, sets corr = 2^(m_old -
// m_new) (what acc must be scaled by), and writes P = bf16(2^(scale2 s - m))
// to p[0, RoundUp(nj, 32)), 0 past the visible keys.
inline void SoftmaxRow(const float* s, size_t nj, size_t visible, float scale2, float* m,
                       float* l, float* corr, uint16_t* p) {
  const size_t padded = RoundUp(nj, 32);
  if (visible == 0) {
    memset(p, 0, padded * sizeof(uint16_t));
    *corr = 1.0f;
    return;
  }
  const __m512 vscale = _mm512_set1_ps(scale2);
  __m512 vmax = _mm512_set1_ps(kNegInf);
  for (size_t j = 0; j < visible; j += 16) {
    const __mmask16 k = Mask16(visible - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vscale);
    vmax = _mm512_mask_max_ps(vmax, k, x, vmax);  // NaN: the NaN lane keeps vmax
  }
  const float tile_max = HMax(vmax);
  const float m_old = *m;
  const float m_new = tile_max > m_old ? tile_max : m_old;
  // A row that has seen nothing finite shifts by 0: 2^(-inf - 0) = 0.
  const float shift = m_new == kNegInf ? 0.0f : m_new;
  float c = 0.0f;
  if (m_old != kNegInf) {
    const __m512 e = Exp2(_mm512_set1_ps(m_old - shift));
    c = _mm512_cvtss_f32(e);
  }
  const __m512 vshift = _mm512_set1_ps(-shift);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  size_t j = 0;
  for (; j + 32 <= visible; j += 32) {
    const __m512 e0 = Exp2(_mm512_fmadd_ps(_mm512_loadu_ps(s + j), vscale, vshift));
    const __m512 e1 = Exp2(_mm512_fmadd_ps(_mm512_loadu_ps(s + j + 16), vscale, vshift));
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  for (; j < padded; j += 32) {
    const size_t n = j < visible ? visible - j : 0;
    const __mmask16 k0 = Mask16(n), k1 = Mask16(n > 16 ? n - 16 : 0);
    const __m512 e0 = _mm512_maskz_mov_ps(
        k0, Exp2(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k0, s + j), vscale, vshift)));
    const __m512 e1 = _mm512_maskz_mov_ps(
        k1, Exp2(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k1, s + j + 16), vscale, vshift)));
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  *l = *l * c + HSum(_mm512_add_ps(sum0, sum1));
  *m = m_new;
  *corr = c;
}

// Rows whose P V over this block must skip masked keys because the block's
// V holds inf or NaN (0 * NaN is NaN): acc[r] = saved[r] * corr + sum over
// the visible keys, in f32 from the packed bf16 operands.  s_r: null, or
// the row's final scores (with a window or a bias: -inf marks a key the
// row does not see).
inline void RedoRowWithoutMaskedKeys(const uint16_t* p_r, const uint16_t* vp, size_t Lv,
                                     size_t L, size_t visible, float corr,
                                     const float* saved_r, float* acc_r, const float* s_r) {
  for (size_t n = 0; n < L; ++n) {
    float sum = 0.0f;
    for (size_t j = 0; j < visible; ++j) {
      if (s_r != nullptr && s_r[j] == kNegInf) continue;
      sum += Bf16ToF32(p_r[j]) * Bf16ToF32(vp[(j / 2) * 2 * Lv + 2 * n + (j & 1)]);
    }
    acc_r[n] = saved_r[n] * corr + sum;
  }
}

// Final rows (acc / l, zeros for a row that saw no key) to out, or records
// (acc, m, l) to partial.
inline void FinishRows(const AttnDims& a, const AttnViews& v, size_t b, size_t h, size_t i0,
                       size_t rows, const AttnScratch& s, float* partial) {
  const size_t L = a.head_dim;
  for (size_t r = 0; r < rows; ++r) {
    const float* acc_r = s.acc + r * s.Lv;
    if (partial != nullptr) {
      float* rec = partial + r * (L + 2);
      memcpy(rec, acc_r, L * sizeof(float));
      rec[L] = s.m[r];
      rec[L + 1] = s.l[r];
      continue;
    }
    const float l = s.l[r];
    // l > 0: normal; l = 0: nothing seen, zeros; NaN: NaN.  A sink joins
    // the denominator (SinkFactor).
    const float inv = a.opt != nullptr && a.opt->sinks != nullptr
                          ? SinkFactor(s.m[r], l, kLog2e * a.opt->sinks[a.query_head(h, i0 + r)])
                          : l > 0.0f ? 1.0f / l : (l == 0.0f ? 0.0f : l);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (size_t c = 0; c < s.Lv; c += 16) {
      _mm512_storeu_ps(s.row + c, _mm512_mul_ps(_mm512_loadu_ps(acc_r + c), vinv));
    }
    StoreRowX86(s.row, L, v.out.dtype, v.out.Row(b, h, i0 + r));
  }
}

// ---------------------------------------------------------------------------
// The VDPBF16PS products of a group of R query rows.

inline __m512 Dp(__m512 acc, uint32_t pair, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)), (__m512bh)b);
}

// s[r][t0 + 16 c + n] = Q[r] . K[t0 + 16 c + n] for NC vectors of keys.
template <int R, int NC>
inline void ScoresTile(const uint32_t* q32, size_t q_stride, size_t pairs, const uint32_t* kt,
                       size_t t0, float* s) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (size_t p = 0; p < pairs; ++p) {
    __m512i kv[NC];
    for (int c = 0; c < NC; ++c) kv[c] = _mm512_loadu_si512(kt + p * kKeyBlock + t0 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const uint32_t qpair = q32[r * q_stride + p];
      for (int c = 0; c < NC; ++c) acc[r][c] = Dp(acc[r][c], qpair, kv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(s + r * kKeyBlock + t0 + 16 * c, acc[r][c]);
}

template <int R>
inline void ScoresGroup(const uint16_t* qp, size_t Lp, size_t L, const uint32_t* kt, size_t nj,
                        float* s) {
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(qp);
  const size_t pairs = (L + 1) / 2;
  size_t t0 = 0;
  for (; t0 + 64 <= nj; t0 += 64) ScoresTile<R, 4>(q32, Lp / 2, pairs, kt, t0, s);
  switch ((nj - t0 + 15) / 16) {  // 1 to 4 vectors of keys are left
    case 4: ScoresTile<R, 4>(q32, Lp / 2, pairs, kt, t0, s); break;
    case 3: ScoresTile<R, 3>(q32, Lp / 2, pairs, kt, t0, s); break;
    case 2: ScoresTile<R, 2>(q32, Lp / 2, pairs, kt, t0, s); break;
    case 1: ScoresTile<R, 1>(q32, Lp / 2, pairs, kt, t0, s); break;
    default: break;
  }
}

// acc[r][c0 + 16 c + n] = corr[r] acc[r][...] + sum_j P[r][j] V[j][...].
template <int R, int NC>
inline void PvTile(const uint16_t* p, const uint16_t* vp, size_t Lv, size_t key_pairs,
                   const float* corr, float* acc, size_t c0) {
  __m512 o[R][NC];
  for (int r = 0; r < R; ++r) {
    const __m512 cr = _mm512_set1_ps(corr[r]);
    for (int c = 0; c < NC; ++c) o[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * Lv + c0 + 16 * c), cr);
  }
  const uint32_t* p32 = reinterpret_cast<const uint32_t*>(p);
  for (size_t q = 0; q < key_pairs; ++q) {
    __m512i vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_si512(vp + q * 2 * Lv + 2 * (c0 + 16 * c));
    for (int r = 0; r < R; ++r) {
      const uint32_t pair = p32[r * (kKeyBlock / 2) + q];
      for (int c = 0; c < NC; ++c) o[r][c] = Dp(o[r][c], pair, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc + r * Lv + c0 + 16 * c, o[r][c]);
}

template <int R>
inline void PvGroup(const uint16_t* p, const uint16_t* vp, size_t Lv, size_t nj,
                    const float* corr, float* acc) {
  const size_t key_pairs = (nj + 1) / 2;
  size_t c0 = 0;
  for (; c0 + 64 <= Lv; c0 += 64) PvTile<R, 4>(p, vp, Lv, key_pairs, corr, acc, c0);
  switch ((Lv - c0) / 16) {
    case 3: PvTile<R, 3>(p, vp, Lv, key_pairs, corr, acc, c0); break;
    case 2: PvTile<R, 2>(p, vp, Lv, key_pairs, corr, acc, c0); break;
    case 1: PvTile<R, 1>(p, vp, Lv, key_pairs, corr, acc, c0); break;
    default: break;
  }
}

// Per row of a group, the end of the block's keys it sees (keys j0 ..
// j0 + keys[r] - 1 hold them; 0: none, also when a window starts past the
// block).
inline void BlockKeys(const AttnDims& a, size_t i0, size_t rows, size_t j0, size_t nj,
                      size_t* keys) {
  for (size_t r = 0; r < rows; ++r) {
    const size_t visible = a.visible_keys(i0 + r);
    keys[r] = visible <= j0 || a.first_key(i0 + r) >= j0 + nj ? 0 : MinSize(visible - j0, nj);
  }
}

// Whether a call's rows need GroupExtras (a window, or something the model
// adds to the scores): then the scores reach SoftmaxGroup in base 2.
inline bool HasExtras(const AttnDims& a) {
  return a.window != 0 || (a.opt != nullptr && a.opt->Scores());
}

// 16 elements [j, j + 16) (mask k) of a bias row of `dtype` as f32.
inline __m512 LoadBias16(const char* row, DType dtype, size_t j, __mmask16 k) {
  switch (dtype) {
    case DType::kF32:
      return _mm512_maskz_loadu_ps(k, reinterpret_cast<const float*>(row) + j);
    case DType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(
              _mm256_maskz_loadu_epi16(k, reinterpret_cast<const uint16_t*>(row) + j)),
          16));
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, reinterpret_cast<const uint16_t*>(row) + j));
  }
  return _mm512_setzero_ps();
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = 2^(-2 log2(e) |x|) in (0, 1], as
// the Highway kernels compute it (TanhByExp2): NaN stays NaN, +-inf gives +-1.
inline __m512 Tanh(__m512 x) {
  const __m512 e = Exp2(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.0f * kLog2e)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}

// The model's terms and the window on a group's raw scores Q K (s[r] rows
// kKeyBlock apart, keys j0 .. j0 + nj - 1, rows i0 .. of head (b, h)): each
// row's first keys[r] scores become its base-2 scores, in the API's order
// scale, softcap, ALiBi, bias; keys before the row's window -inf.
// SoftmaxGroup then takes them at scale 1.
inline void GroupExtras(const AttnDims& a, size_t b, size_t h, size_t i0, size_t rows, size_t j0,
                        const size_t* keys, float scale2, float* s) {
  const AttnOptions* o = a.opt;
  const float cap2 = o != nullptr ? o->softcap * kLog2e : 0.0f;
  const __m512 vscale = _mm512_set1_ps(scale2), vcap = _mm512_set1_ps(cap2),
               vinv_cap = _mm512_set1_ps(cap2 > 0.0f ? (1.0f / cap2 < std::numeric_limits<float>::max() ? 1.0f / cap2 : std::numeric_limits<float>::max()) : 0.0f),
               vlog2e = _mm512_set1_ps(kLog2e), vneg_inf = _mm512_set1_ps(kNegInf);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (size_t r = 0; r < rows; ++r) {
    const size_t n = keys[r];
    if (n == 0) continue;
    const size_t i = i0 + r;
    float* s_r = s + r * kKeyBlock;
    const size_t first = a.first_key(i);
    const size_t lo = first > j0 ? first - j0 : 0;
    const float slope2 =
        o != nullptr && o->slopes != nullptr ? o->slopes[a.query_head(h, i)] * kLog2e : 0.0f;
    // slope (j - p), j - p exact in f32 (|j|, |p| < 2^24).
    const __m512 vslope = _mm512_set1_ps(slope2),
                 vdist0 = _mm512_set1_ps(static_cast<float>(static_cast<long long>(j0) -
                                                            a.position(i)));
    const char* bias = o != nullptr && o->has_bias ? o->bias.Row(b, h, i) : nullptr;
    const size_t bias_bytes = bias != nullptr ? DTypeBytes(o->bias.dtype) : 0;
    for (size_t j = 0; j < n; j += 16) {
      const __mmask16 k = Mask16(n - j);
      __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s_r + j), vscale);
      if (cap2 > 0.0f) x = _mm512_mul_ps(Tanh(_mm512_mul_ps(x, vinv_cap)), vcap);
      const __m512i idx = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(j)));
      if (slope2 != 0.0f) {
        const __m512 dist = _mm512_add_ps(vdist0, _mm512_cvtepi32_ps(idx));
        x = _mm512_fmadd_ps(vslope, dist, x);
      }
      if (bias != nullptr) {
        x = _mm512_fmadd_ps(LoadBias16(bias + j0 * bias_bytes, o->bias.dtype, j, k), vlog2e, x);
      }
      if (lo > j) {
        const __mmask16 before =
            _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo)));
        x = _mm512_mask_mov_ps(x, before, vneg_inf);
      }
      _mm512_mask_storeu_ps(s_r + j, k, x);
    }
  }
}

// Softmax of a group's score rows (s[r], kKeyBlock apart) into p, then the
// rows that need P V redone without masked keys saved (returns how many):
// those that see only part of the block, and with `masked_inside` (a window
// or a bias: -inf scores among the keys[r]) every row.
inline size_t SoftmaxGroup(const float* s, size_t rows, size_t nj, const size_t* keys,
                           float scale2, float* m, float* l, float* corr, uint16_t* p,
                           bool v_nonfinite, const float* acc, size_t Lv, float* saved,
                           size_t* redo, bool masked_inside = false) {
  size_t n_redo = 0;
  for (size_t r = 0; r < rows; ++r) {
    SoftmaxRow(s + r * kKeyBlock, nj, keys[r], scale2, m + r, l + r, corr + r,
               p + r * kKeyBlock);
    if (v_nonfinite && (keys[r] < nj || masked_inside)) {
      memcpy(saved + n_redo * Lv, acc + r * Lv, Lv * sizeof(float));
      redo[n_redo++] = r;
    }
  }
  return n_redo;
}

// s: null, or the group's final scores (GroupExtras), whose -inf entries
// are keys the rows do not see.
inline void RedoRows(size_t n_redo, const size_t* redo, const uint16_t* p, const uint16_t* vp,
                     size_t Lv, size_t L, const size_t* keys, const float* corr,
                     const float* saved, float* acc, const float* s) {
  for (size_t i = 0; i < n_redo; ++i) {
    const size_t r = redo[i];
    RedoRowWithoutMaskedKeys(p + r * kKeyBlock, vp, Lv, L, keys[r], corr[r], saved + i * Lv,
                             acc + r * Lv, s != nullptr ? s + r * kKeyBlock : nullptr);
  }
}

// The scores of a group of rows (first row i of the head) into P:
// GroupExtras first where the call has any (then at scale 1), SoftmaxGroup,
// and the rows to redo.  Returns the scores RedoRows must consult (null:
// none).
inline const float* GroupSoftmax(const AttnDims& a, const AttnScratch& s, size_t i, size_t r0,
                                 size_t rows, size_t j0, size_t nj, const size_t* keys,
                                 float scale2, bool v_nonfinite, size_t* redo, size_t* n_redo) {
  const bool extras = HasExtras(a);
  if (extras) GroupExtras(a, s.b, s.h, i, rows, j0, keys, scale2, s.s);
  *n_redo = SoftmaxGroup(s.s, rows, nj, keys, extras ? 1.0f : scale2, s.m + r0, s.l + r0,
                         s.corr + r0, s.p, v_nonfinite, s.acc + r0 * s.Lv, s.Lv, s.saved, redo,
                         extras);
  return extras ? s.s : nullptr;
}

// Rows r0 .. r0 + R - 1 of the item (row i of the head first).
template <int R>
inline void Avx512Group(const AttnDims& a, const AttnScratch& s, size_t i, size_t r0, size_t j0,
                        size_t nj, const size_t* keys, float scale2, bool v_nonfinite) {
  size_t any = 0;
  for (int r = 0; r < R; ++r) any |= keys[r];
  if (any == 0) return;  // above the causal diagonal: nothing to add
  ScoresGroup<R>(s.qp + r0 * s.Lp, s.Lp, a.head_dim, s.kt, nj, s.s);
  size_t redo[R], n_redo;
  const float* final_s = GroupSoftmax(a, s, i, r0, R, j0, nj, keys, scale2, v_nonfinite, redo,
                                      &n_redo);
  PvGroup<R>(s.p, s.vp, s.Lv, nj, s.corr + r0, s.acc + r0 * s.Lv);
  RedoRows(n_redo, redo, s.p, s.vp, s.Lv, a.head_dim, keys, s.corr + r0, s.saved,
           s.acc + r0 * s.Lv, final_s);
}

// Sum of each of 16 vectors, as one vector: lane m holds the sum of
// v[4 (m % 4) + m / 4] (the network's natural order is that 4 x 4
// transpose; callers store key j's vector at slot 4 (j % 4) + j / 4 so that
// lane j holds key j).
inline __m512 Reduce16(__m512 v[16]) {
  __m512 w[8], u[4], z[2];
  for (int i = 0; i < 8; ++i) {
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// A decode step's one query row against bf16 K read in place (no K^T
// packing, which would cost more than the row's own products): 16 keys at a
// time, each a VDPBF16PS chain over the dims, then one reduction of the 16.
// Needs L <= 128 (the row's Q in 4 registers).
constexpr size_t kDirectMaxDim = 128;
inline void ScoresOneRowDirect(const uint16_t* q, size_t L, const TensorView& k, size_t b,
                               size_t g, size_t j0, size_t nj, float* s) {
  const size_t chunks = (L + 31) / 32;
  __m512bh qv[4];
  for (size_t c = 0; c < 4; ++c) {
    qv[c] = (__m512bh)(c < chunks ? _mm512_loadu_si512(q + 32 * c) : _mm512_setzero_si512());
  }
  const __mmask32 last = Mask32(L - 32 * (chunks - 1));
  const char* base = k.Row(b, g, j0);
  const size_t stride = k.ss * sizeof(uint16_t);
  for (size_t t = 0; t < nj; t += 16) {
    __m512 acc[16];
    for (int kk = 0; kk < 16; ++kk) {
      const int slot = 4 * (kk % 4) + kk / 4;
      __m512 a = _mm512_setzero_ps();
      if (t + kk < nj) {
        const uint16_t* row = reinterpret_cast<const uint16_t*>(base + (t + kk) * stride);
        // The rows 32 keys ahead (K streams from L3 or memory in a decode).
        const char* ahead = base + (t + kk + 32) * stride;
        for (size_t c = 0; c < 2 * chunks; ++c) _mm_prefetch(ahead + 64 * c, _MM_HINT_T0);
        for (size_t c = 0; c + 1 < chunks; ++c) {
          a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_loadu_si512(row + 32 * c));
        }
        a = _mm512_dpbf16_ps(a, qv[chunks - 1],
                             (__m512bh)_mm512_maskz_loadu_epi16(last, row + 32 * (chunks - 1)));
      }
      acc[slot] = a;
    }
    _mm512_storeu_ps(s + t, Reduce16(acc));
  }
}

// Rows [r0, r1) of the work item on VDPBF16PS, four at a time.
inline void Avx512Rows(const AttnDims& a, const AttnScratch& s, size_t i0, size_t r0, size_t r1,
                       size_t j0, size_t nj, float scale2, bool v_nonfinite) {
  size_t keys[4];
  for (size_t r = r0; r < r1; r += 4) {
    const size_t n = MinSize(4, r1 - r);
    BlockKeys(a, i0 + r, n, j0, nj, keys);
    switch (n) {
      case 4: Avx512Group<4>(a, s, i0 + r, r, j0, nj, keys, scale2, v_nonfinite); break;
      case 3: Avx512Group<3>(a, s, i0 + r, r, j0, nj, keys, scale2, v_nonfinite); break;
      case 2: Avx512Group<2>(a, s, i0 + r, r, j0, nj, keys, scale2, v_nonfinite); break;
      default: Avx512Group<1>(a, s, i0 + r, r, j0, nj, keys, scale2, v_nonfinite); break;
    }
  }
}

inline float Base2Scale(const AttnDims& a) { return a.scale * 1.44269504088896341f; }

// The work item's frame: pack Q, walk the key blocks (pack K^T and V once
// per block for all the rows), hand each block to `rows_fn(r0, r1, j0, nj,
// v_nonfinite)` for the item's rows, finish.  rows_fn covers all rows.
template <class BlockFn>
inline void AttentionItem(const AttnDims& a, const AttnViews& v, size_t b, size_t h, size_t i0,
                          size_t i1, size_t key_begin, size_t key_end, float* partial,
                          const AttnScratch& s, const BlockFn& block_fn, bool pack_kt = true) {
  const size_t L = a.head_dim, rows = i1 - i0, g = h / a.group();
  PackQ(v.q, b, h, i0, rows, L, s.Lp, s.qp);
  // Rows up to a multiple of 16: an AMX group may run past the last row.
  memset(s.acc, 0, RoundUp(rows, 16) * s.Lv * sizeof(float));
  for (size_t r = 0; r < RoundUp(rows, 16); ++r) {
    s.m[r] = kNegInf;
    s.l[r] = 0.0f;
  }
  const size_t last_visible = a.visible_keys(i1 - 1);
  const size_t keys_needed = MinSize(last_visible, key_end);
  // Under a window, the blocks before the first row's first key are skipped.
  const size_t first = a.first_key(i0);
  for (size_t j0 = first > key_begin ? first : key_begin; j0 < keys_needed; j0 += kKeyBlock) {
    const size_t nj = MinSize(kKeyBlock, keys_needed - j0);
    if (pack_kt) PackKT(v.k, b, g, j0, nj, L, s.Lp, s.kt);
    const bool v_nonfinite = PackVPairs(v.v, b, g, j0, nj, L, s.Lv, s.vp);
    block_fn(j0, nj, v_nonfinite);
  }
  FinishRows(a, v, b, h, i0, rows, s, partial);
}

inline void Avx512AttentionRows(const AttnDims& a, const AttnViews& v, size_t b, size_t h,
                                size_t i0, size_t i1, size_t key_begin, size_t key_end,
                                float* partial, float* scratch) {
  const AttnScratch s = CarveAttnScratch(a, scratch, b, h);
  const float scale2 = Base2Scale(a);
  if (i1 - i0 == 1 && v.k.dtype == DType::kBF16 && a.head_dim <= kDirectMaxDim) {
    // One row (a decode step of one query head): K read in place.
    const size_t g = h / a.group();
    AttentionItem(a, v, b, h, i0, i1, key_begin, key_end, partial, s,
                  [&](size_t j0, size_t nj, bool v_nonfinite) {
                    size_t keys[1];
                    BlockKeys(a, i0, 1, j0, nj, keys);
                    if (keys[0] == 0) return;
                    ScoresOneRowDirect(s.qp, a.head_dim, v.k, b, g, j0, nj, s.s);
                    size_t redo[1], n_redo;
                    const float* final_s = GroupSoftmax(a, s, i0, 0, 1, j0, nj, keys, scale2,
                                                        v_nonfinite, redo, &n_redo);
                    PvGroup<1>(s.p, s.vp, s.Lv, nj, s.corr, s.acc);
                    RedoRows(n_redo, redo, s.p, s.vp, s.Lv, a.head_dim, keys, s.corr, s.saved,
                             s.acc, final_s);
                  },
                  /*pack_kt=*/false);
    return;
  }
  AttentionItem(a, v, b, h, i0, i1, key_begin, key_end, partial, s,
                [&](size_t j0, size_t nj, bool v_nonfinite) {
                  Avx512Rows(a, s, i0, 0, i1 - i0, j0, nj, scale2, v_nonfinite);
                });
}

// ---------------------------------------------------------------------------
// Projection.

// Packs Wo (rows k of [H*L][D]) into the native panels (native.h).
inline void PackWoPanels(const ProjDims& p, const TensorView& wo, uint16_t* packed,
                         size_t panel0, size_t panel1) {
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  const size_t K = p.inner(), Kp = InnerPadded(p), D = p.model_dim;
  for (size_t panel = panel0; panel < panel1; ++panel) {
    const size_t c0 = panel * kPanelCols, n = MinSize(kPanelCols, D - c0);
    uint16_t* dst = packed + panel * Kp * kPanelCols;
    for (size_t q = 0; q < Kp / 2; ++q) {
      const size_t k = 2 * q;
      const __m512i a = k < K ? Load32Bf16(wo.Row(0, 0, k), wo.dtype, c0, n) : _mm512_setzero_si512();
      const __m512i c = k + 1 < K ? Load32Bf16(wo.Row(0, 0, k + 1), wo.dtype, c0, n)
                                  : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + q * 64, _mm512_permutex2var_epi16(a, lo_idx, c));
      _mm512_storeu_si512(dst + q * 64 + 32, _mm512_permutex2var_epi16(a, hi_idx, c));
    }
  }
}

// O rows [s0, s0 + rows) of batch b, concatenated over the heads (k = h*L +
// l), as bf16 [RoundUp(rows, 16)][Kp], zeros past H*L and past the rows.
inline void PackHeadRows(const ProjDims& p, const TensorView& heads, size_t b, size_t s0,
                         size_t rows, uint16_t* op) {
  const size_t L = p.head_dim, Kp = InnerPadded(p);
  for (size_t r = 0; r < RoundUp(rows, 16); ++r) {
    uint16_t* dst = op + r * Kp;
    memset(dst, 0, Kp * sizeof(uint16_t));
    if (r >= rows) continue;
    for (size_t h = 0; h < p.heads; ++h) {
      const char* src = heads.Row(b, h, s0 + r);
      for (size_t d0 = 0; d0 < L; d0 += 32) {
        const size_t n = MinSize(32, L - d0);
        _mm512_mask_storeu_epi16(dst + h * L + d0, Mask32(n), Load32Bf16(src, heads.dtype, d0, n));
      }
    }
  }
}

// Scratch of a projection work item: the packed O rows, a 32 x kPanelCols
// f32 tile (AMX; AVX512_BF16 uses at most 6 rows of two panels), one row of
// up to two panels before it is stored.
inline size_t ProjScratchFloats(const ProjDims& p) {
  return kProjRows * InnerPadded(p) / 2 + 32 * kPanelCols + 2 * kPanelCols;
}

// y rows [s0, s0 + rows), columns [c0, c0 + n) from f32 tile rows (ld
// apart), plus bias.
inline void StoreYRows(const float* tile, size_t ld, size_t rows, const float* bias, size_t c0,
                       size_t n, const TensorView& y, size_t b, size_t s0, float* row) {
  for (size_t r = 0; r < rows; ++r) {
    const float* t = tile + r * ld;
    for (size_t c = 0; c < n; c += 16) {
      const __mmask16 k = Mask16(n - c);
      __m512 x = _mm512_maskz_loadu_ps(k, t + c);
      if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, bias + c0 + c));
      _mm512_mask_storeu_ps(row + c, k, x);
    }
    StoreRowX86(row, n, y.dtype, y.Row(b, 0, s0 + r) + c0 * DTypeBytes(y.dtype));
  }
}

// One group of R rows x one panel (2 vectors of 16 columns) on VDPBF16PS.
template <int R>
inline void ProjectGroupPanel(const uint16_t* op, size_t Kp, const uint16_t* panel, float* out) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const uint32_t* o32 = reinterpret_cast<const uint32_t*>(op);
  for (size_t q = 0; q < Kp / 2; ++q) {
    const __m512i w0 = _mm512_loadu_si512(panel + q * 64);
    const __m512i w1 = _mm512_loadu_si512(panel + q * 64 + 32);
    for (int r = 0; r < R; ++r) {
      const uint32_t pair = o32[r * (Kp / 2) + q];
      acc[r][0] = Dp(acc[r][0], pair, w0);
      acc[r][1] = Dp(acc[r][1], pair, w1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * kPanelCols, acc[r][0]);
    _mm512_storeu_ps(out + r * kPanelCols + 16, acc[r][1]);
  }
}

// R rows x two adjacent panels (4 vectors, 64 columns): each broadcast pair
// of O feeds 4 VDPBF16PS instead of 2.  out: [R][2 kPanelCols].
template <int R>
inline void ProjectGroupTwoPanels(const uint16_t* op, size_t Kp, const uint16_t* panel,
                                  float* out) {
  const uint16_t* panel2 = panel + Kp * kPanelCols;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint32_t* o32 = reinterpret_cast<const uint32_t*>(op);
  for (size_t q = 0; q < Kp / 2; ++q) {
    const __m512i w0 = _mm512_loadu_si512(panel + q * 64);
    const __m512i w1 = _mm512_loadu_si512(panel + q * 64 + 32);
    const __m512i w2 = _mm512_loadu_si512(panel2 + q * 64);
    const __m512i w3 = _mm512_loadu_si512(panel2 + q * 64 + 32);
    for (int r = 0; r < R; ++r) {
      const uint32_t pair = o32[r * (Kp / 2) + q];
      acc[r][0] = Dp(acc[r][0], pair, w0);
      acc[r][1] = Dp(acc[r][1], pair, w1);
      acc[r][2] = Dp(acc[r][2], pair, w2);
      acc[r][3] = Dp(acc[r][3], pair, w3);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + r * 2 * kPanelCols + 16 * c, acc[r][c]);
}

inline void Avx512ProjectRows(const ProjDims& p, const TensorView& heads,
                              const uint16_t* packed_wo, const float* bias, const TensorView& y,
                              size_t b, size_t s0, size_t s1, size_t panel0, size_t panel1,
                              float* scratch) {
  const size_t Kp = InnerPadded(p), rows = s1 - s0;
  uint16_t* op = reinterpret_cast<uint16_t*>(scratch);
  float* tile = scratch + kProjRows * Kp / 2;
  float* row = tile + 32 * kPanelCols;
  PackHeadRows(p, heads, b, s0, rows, op);
  size_t panel = panel0;
  for (; panel + 2 <= panel1; panel += 2) {  // two panels at a time, 6 rows
    const uint16_t* w = packed_wo + panel * Kp * kPanelCols;
    const size_t c0 = panel * kPanelCols, n = MinSize(2 * kPanelCols, p.model_dim - c0);
    for (size_t r = 0; r < rows; r += 6) {
      const size_t g = MinSize(6, rows - r);
      const uint16_t* o = op + r * Kp;
      switch (g) {
        case 6: ProjectGroupTwoPanels<6>(o, Kp, w, tile); break;
        case 5: ProjectGroupTwoPanels<5>(o, Kp, w, tile); break;
        case 4: ProjectGroupTwoPanels<4>(o, Kp, w, tile); break;
        case 3: ProjectGroupTwoPanels<3>(o, Kp, w, tile); break;
        case 2: ProjectGroupTwoPanels<2>(o, Kp, w, tile); break;
        default: ProjectGroupTwoPanels<1>(o, Kp, w, tile); break;
      }
      StoreYRows(tile, 2 * kPanelCols, g, bias, c0, n, y, b, s0 + r, row);
    }
  }
  for (; panel < panel1; ++panel) {
    const uint16_t* w = packed_wo + panel * Kp * kPanelCols;
    const size_t c0 = panel * kPanelCols, n = MinSize(kPanelCols, p.model_dim - c0);
    for (size_t r = 0; r < rows; r += 8) {
      const size_t g = MinSize(8, rows - r);
      const uint16_t* o = op + r * Kp;
      switch (g) {
        case 8: ProjectGroupPanel<8>(o, Kp, w, tile); break;
        case 7: ProjectGroupPanel<7>(o, Kp, w, tile); break;
        case 6: ProjectGroupPanel<6>(o, Kp, w, tile); break;
        case 5: ProjectGroupPanel<5>(o, Kp, w, tile); break;
        case 4: ProjectGroupPanel<4>(o, Kp, w, tile); break;
        case 3: ProjectGroupPanel<3>(o, Kp, w, tile); break;
        case 2: ProjectGroupPanel<2>(o, Kp, w, tile); break;
        default: ProjectGroupPanel<1>(o, Kp, w, tile); break;
      }
      StoreYRows(tile, kPanelCols, g, bias, c0, n, y, b, s0 + r, row);
    }
  }
}

}  // namespace
}  // namespace native
}  // namespace headsum

#endif  // HEADSUM_KERNELS_NATIVE_X86_BF16_INL_H_
