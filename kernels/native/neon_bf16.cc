// NEON_BF16: bf16 products on Arm's BFDOT (Armv8.6 BF16: Neoverse V1/V2/N2,
// Graviton3/4, Cortex-A710 and later, Apple M2 and later).  The kernels are
// compiled for armv8.6-a+bf16 (the pragma below), the rest of the file stays
// baseline; run-time detection is HWCAP2_BF16 (native_common.cc).
//
// Same layouts as the x86 paths (x86_bf16-inl.h): Q rows padded to Lp, K^T
// in pairs of dims (kt[p][j] = K[j][2p] | K[j][2p+1] << 16), V in pairs of
// keys, P rounded to bf16 (BFCVTN, to nearest even), and the packed Wo
// panels of native.h, so BFDOT's pair semantics (lane i += a[2i] b[2i] +
// a[2i+1] b[2i+1]) read them as VDPBF16PS does, 4 lanes at a time.  Packing
// is plain C++.
#include "kernels/native/native.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include <limits>

namespace headsum {
namespace native {
namespace {

constexpr size_t kKeyBlock = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }
size_t MinSize(size_t a, size_t b) { return a < b ? a : b; }

// Elements [0, n) of a row of `dtype` as bf16 bits into dst[0, n).
void RowToBf16(const char* row, DType dtype, size_t n, uint16_t* dst) {
  switch (dtype) {
    case DType::kBF16:
      memcpy(dst, row, n * sizeof(uint16_t));
      return;
    case DType::kF32: {
      const float* f = reinterpret_cast<const float*>(row);
      for (size_t i = 0; i < n; ++i) dst[i] = F32ToBf16(f[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      for (size_t i = 0; i < n; ++i) dst[i] = F32ToBf16(F16ToF32(h[i]));
      return;
    }
  }
}

struct Scratch {
  size_t Lp, Lv;
  uint16_t* qp;   // [kQueryBlock][Lp]
  uint32_t* kt;   // [Lp/2][kKeyBlock]
  uint16_t* vp;   // [kKeyBlock/2][2 Lv]
  float* s;       // [4][kKeyBlock]
  uint16_t* p;    // [4][kKeyBlock]
  float* acc;     // [kQueryBlock][Lv]
  float* m;       // [kQueryBlock]
  float* l;       // [kQueryBlock]
  float* corr;    // [kQueryBlock]
  float* saved;   // [4][Lv]
  float* row;     // [Lv]
  uint16_t* tmp;  // [Lp] one row as bf16
};

size_t ScratchFloats(const AttnDims& a) {
  const size_t Lp = RoundUp(a.head_dim, 32), Lv = RoundUp(a.head_dim, 16);
  return kQueryBlock * Lp / 2 + Lp / 2 * kKeyBlock + kKeyBlock * Lv + 4 * kKeyBlock +
         2 * kKeyBlock + kQueryBlock * Lv + 3 * kQueryBlock + 4 * Lv + Lv + Lp / 2 + 13 * 16;
}

Scratch Carve(const AttnDims& a, float* f) {
  Scratch s;
  s.Lp = RoundUp(a.head_dim, 32);
  s.Lv = RoundUp(a.head_dim, 16);
  const auto take = [&](size_t floats) {
    float* at = f;
    f += RoundUp(floats, 16);
    return at;
  };
  s.qp = reinterpret_cast<uint16_t*>(take(kQueryBlock * s.Lp / 2));
  s.kt = reinterpret_cast<uint32_t*>(take(s.Lp / 2 * kKeyBlock));
  s.vp = reinterpret_cast<uint16_t*>(take(kKeyBlock * s.Lv));
  s.s = take(4 * kKeyBlock);
  s.p = reinterpret_cast<uint16_t*>(take(2 * kKeyBlock));
  s.acc = take(kQueryBlock * s.Lv);
  s.m = take(kQueryBlock);
  s.l = take(kQueryBlock);
  s.corr = take(kQueryBlock);
  s.saved = take(4 * s.Lv);
  s.row = take(s.Lv);
  s.tmp = reinterpret_cast<uint16_t*>(take(s.Lp / 2));
  return s;
}

void PackQ(const TensorView& q, size_t b, size_t h, size_t i0, size_t rows, size_t L, size_t Lp,
           uint16_t* qp) {
  for (size_t r = 0; r < rows; ++r) {
    uint16_t* dst = qp + r * Lp;
    memset(dst, 0, Lp * sizeof(uint16_t));
    RowToBf16(q.Row(b, h, i0 + r), q.dtype, L, dst);
  }
}

void PackKT(const TensorView& k, size_t b, size_t g, size_t j0, size_t nj, size_t L, size_t Lp,
            uint16_t* tmp, uint32_t* kt) {
  const size_t keys = RoundUp(nj, 16);
  for (size_t j = 0; j < keys; ++j) {
    memset(tmp, 0, Lp * sizeof(uint16_t));
    if (j < nj) RowToBf16(k.Row(b, g, j0 + j), k.dtype, L, tmp);
    for (size_t p = 0; p < Lp / 2; ++p) {
      kt[p * kKeyBlock + j] = uint32_t(tmp[2 * p]) | (uint32_t(tmp[2 * p + 1]) << 16);
    }
  }
}

bool PackVPairs(const TensorView& v, size_t b, size_t g, size_t j0, size_t nj, size_t L,
                size_t Lv, uint16_t* tmp, uint16_t* vp) {
  bool nonfinite = false;
  const size_t pairs = RoundUp(nj, 32) / 2;
  memset(vp, 0, pairs * 2 * Lv * sizeof(uint16_t));
  for (size_t j = 0; j < nj; ++j) {
    RowToBf16(v.Row(b, g, j0 + j), v.dtype, L, tmp);
    uint16_t* dst = vp + (j / 2) * 2 * Lv + (j & 1);
    for (size_t n = 0; n < L; ++n) {
      dst[2 * n] = tmp[n];
      nonfinite |= (tmp[n] & 0x7F80) == 0x7F80;
    }
  }
  return nonfinite;
}

#pragma GCC push_options
#pragma GCC target("arch=armv8.6-a+bf16")

// 2^x for x <= 0, -inf and NaN (as x86_bf16-inl.h's Exp2): 2^n p(f), the
// degree-6 Taylor polynomial of 2^f on [-1/2, 1/2]; below -127 the result is
// 0 (the weight is then under 2^-126 of the row's largest); NaN stays NaN.
float32x4_t Exp2(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-127.0f));
  const float32x4_t n = vrndnq_f32(x);
  const float32x4_t f = vsubq_f32(x, n);
  float32x4_t p = vdupq_n_f32(1.5403530393381608e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(9.6181291076284772e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(5.5504108664821580e-2f), p, f);
  p = vfmaq_f32(vdupq_n_f32(2.4022650695910071e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(6.9314718055994531e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  // 2^n as bits: (n + 127) << 23; n = -127 gives 0.
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

float ScalarExp2(float x) { return vgetq_lane_f32(Exp2(vdupq_n_f32(x)), 0); }

float32x4_t Dot(float32x4_t acc, uint32_t pair, uint32x4_t b) {
  return vbfdotq_f32(acc, vreinterpretq_bf16_u32(vdupq_n_u32(pair)), vreinterpretq_bf16_u32(b));
}

// s[r][t0 .. t0 + 16) = Q[r] . K[...] for R rows.
template <int R>
void ScoresTile(const uint32_t* q32, size_t q_stride, size_t pairs, const uint32_t* kt, size_t t0,
                float* s) {
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = vdupq_n_f32(0.0f);
  for (size_t p = 0; p < pairs; ++p) {
    uint32x4_t kv[4];
    for (int c = 0; c < 4; ++c) kv[c] = vld1q_u32(kt + p * kKeyBlock + t0 + 4 * c);
    for (int r = 0; r < R; ++r) {
      const uint32_t qpair = q32[r * q_stride + p];
      for (int c = 0; c < 4; ++c) acc[r][c] = Dot(acc[r][c], qpair, kv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) vst1q_f32(s + r * kKeyBlock + t0 + 4 * c, acc[r][c]);
}

void SoftmaxRow(const float* s, size_t nj, size_t visible, float scale2, float* m, float* l,
                float* corr, uint16_t* p) {
  const size_t padded = RoundUp(nj, 32);
  memset(p, 0, padded * sizeof(uint16_t));
  if (visible == 0) {
    *corr = 1.0f;
    return;
  }
  float tile_max = kNegInf;
  for (size_t j = 0; j < visible; ++j) {
    const float x = s[j] * scale2;
    tile_max = x > tile_max ? x : tile_max;  // NaN: skipped here, NaN through 2^x
  }
  const float m_old = *m;
  const float m_new = tile_max > m_old ? tile_max : m_old;
  const float shift = m_new == kNegInf ? 0.0f : m_new;
  const float c = m_old == kNegInf ? 0.0f : ScalarExp2(m_old - shift);
  const float32x4_t vscale = vdupq_n_f32(scale2), vshift = vdupq_n_f32(-shift);
  float32x4_t sum = vdupq_n_f32(0.0f);
  size_t j = 0;
  for (; j + 8 <= visible; j += 8) {
    const float32x4_t e0 = Exp2(vfmaq_f32(vshift, vld1q_f32(s + j), vscale));
    const float32x4_t e1 = Exp2(vfmaq_f32(vshift, vld1q_f32(s + j + 4), vscale));
    sum = vaddq_f32(sum, vaddq_f32(e0, e1));
    vst1q_bf16(reinterpret_cast<bfloat16_t*>(p + j),
               vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(e0), e1));
  }
  if (j < visible) {
    float tail[8] = {};
    for (size_t i = 0; j + i < visible; ++i) tail[i] = s[j + i];
    const size_t n = visible - j;
    float32x4_t e0 = Exp2(vfmaq_f32(vshift, vld1q_f32(tail), vscale));
    float32x4_t e1 = Exp2(vfmaq_f32(vshift, vld1q_f32(tail + 4), vscale));
    float e[8];
    vst1q_f32(e, e0);
    vst1q_f32(e + 4, e1);
    for (size_t i = n; i < 8; ++i) e[i] = 0.0f;
    e0 = vld1q_f32(e);
    e1 = vld1q_f32(e + 4);
    sum = vaddq_f32(sum, vaddq_f32(e0, e1));
    uint16_t out[8];
    vst1q_bf16(reinterpret_cast<bfloat16_t*>(out), vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(e0), e1));
    memcpy(p + j, out, n * sizeof(uint16_t));
  }
  *l = *l * c + vaddvq_f32(sum);
  *m = m_new;
  *corr = c;
}

// acc[r][c0 .. c0 + 16) = corr[r] acc + sum over key pairs P V.
template <int R>
void PvTile(const uint16_t* p, const uint16_t* vp, size_t Lv, size_t key_pairs,
            const float* corr, float* acc, size_t c0) {
  float32x4_t o[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c)
      o[r][c] = vmulq_n_f32(vld1q_f32(acc + r * Lv + c0 + 4 * c), corr[r]);
  const uint32_t* p32 = reinterpret_cast<const uint32_t*>(p);
  for (size_t q = 0; q < key_pairs; ++q) {
    uint32x4_t vv[4];
    for (int c = 0; c < 4; ++c)
      vv[c] = vld1q_u32(reinterpret_cast<const uint32_t*>(vp + q * 2 * Lv + 2 * (c0 + 4 * c)));
    for (int r = 0; r < R; ++r) {
      const uint32_t pair = p32[r * (kKeyBlock / 2) + q];
      for (int c = 0; c < 4; ++c) o[r][c] = Dot(o[r][c], pair, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) vst1q_f32(acc + r * Lv + c0 + 4 * c, o[r][c]);
}

// Whether a call's rows need RowExtras (a window, or something the model
// adds to the scores): then the scores reach SoftmaxRow in base 2.
bool HasExtras(const AttnDims& a) { return a.window != 0 || (a.opt != nullptr && a.opt->Scores()); }

// A bias element of `dtype` as f32.
float BiasAt(const char* row, DType dtype, size_t j) {
  switch (dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(row)[j];
    case DType::kBF16: return Bf16ToF32(reinterpret_cast<const uint16_t*>(row)[j]);
    case DType::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(row)[j]);
  }
  return 0.0f;
}

// The model's terms and the window on one row's raw scores Q K (row i of
// head (b, h), keys j0 .. j0 + n - 1): its base-2 scores, in the API's order
// scale, softcap (tanh as the Highway kernels compute it: sign(x) (1 - e) /
// (1 + e), e = 2^(-2 log2(e) |x|)), ALiBi, bias; keys before the row's
// window -inf.  Plain C++ over a row in L1.
void RowExtras(const AttnDims& a, size_t b, size_t h, size_t i, size_t j0, size_t n,
               float scale2, float* s) {
  const AttnOptions* o = a.opt;
  const float cap2 = o != nullptr ? o->softcap * kLog2e : 0.0f;
  const float slope2 =
      o != nullptr && o->slopes != nullptr ? o->slopes[a.query_head(h, i)] * kLog2e : 0.0f;
  const float dist0 = static_cast<float>(static_cast<long long>(j0) - a.position(i));
  const char* bias = o != nullptr && o->has_bias ? o->bias.Row(b, h, i) + j0 * DTypeBytes(o->bias.dtype)
                                                 : nullptr;
  const size_t first = a.first_key(i);
  const size_t lo = first > j0 ? MinSize(first - j0, n) : 0;
  for (size_t j = 0; j < lo; ++j) s[j] = kNegInf;
  for (size_t j = lo; j < n; ++j) {
    float x = s[j] * scale2;
    if (cap2 > 0.0f) {
      const float y = x / cap2;
      const float e = exp2f(-2.0f * kLog2e * fabsf(y));
      x = cap2 * copysignf((1.0f - e) / (1.0f + e), y);
    }
    if (slope2 != 0.0f) x = fmaf(slope2, dist0 + static_cast<float>(j), x);
    if (bias != nullptr) x = fmaf(BiasAt(bias, o->bias.dtype, j), kLog2e, x);
    s[j] = x;
  }
}

template <int R>
void Group(const AttnDims& a, const Scratch& s, size_t b, size_t h, size_t i0, size_t r0,
           size_t j0, size_t nj, float scale2, bool v_nonfinite) {
  size_t keys[R];
  size_t any = 0;
  for (int r = 0; r < R; ++r) {
    const size_t i = i0 + r0 + r, visible = a.visible_keys(i);
    keys[r] = visible <= j0 || a.first_key(i) >= j0 + nj ? 0 : MinSize(visible - j0, nj);
    any |= keys[r];
  }
  if (any == 0) return;
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(s.qp + r0 * s.Lp);
  const size_t pairs = (a.head_dim + 1) / 2;
  for (size_t t0 = 0; t0 < nj; t0 += 16) ScoresTile<R>(q32, s.Lp / 2, pairs, s.kt, t0, s.s);
  const bool extras = HasExtras(a);
  size_t redo[R], n_redo = 0;
  for (int r = 0; r < R; ++r) {
    if (extras && keys[r] != 0) {
      RowExtras(a, b, h, i0 + r0 + r, j0, keys[r], scale2, s.s + r * kKeyBlock);
    }
    SoftmaxRow(s.s + r * kKeyBlock, nj, keys[r], extras ? 1.0f : scale2, s.m + r0 + r,
               s.l + r0 + r, s.corr + r0 + r, s.p + r * kKeyBlock);
    if (v_nonfinite && (keys[r] < nj || extras)) {  // extras: -inf among the keys too
      memcpy(s.saved + n_redo * s.Lv, s.acc + (r0 + r) * s.Lv, s.Lv * sizeof(float));
      redo[n_redo++] = size_t(r);
    }
  }
  const size_t key_pairs = (nj + 1) / 2;
  for (size_t c0 = 0; c0 < s.Lv; c0 += 16) {
    PvTile<R>(s.p, s.vp, s.Lv, key_pairs, s.corr + r0, s.acc + r0 * s.Lv, c0);
  }
  // Rows that must not multiply a masked key's 0 by an inf or NaN in V.
  for (size_t i = 0; i < n_redo; ++i) {
    const size_t r = redo[i];
    float* acc_r = s.acc + (r0 + r) * s.Lv;
    for (size_t n = 0; n < a.head_dim; ++n) {
      float sum = 0.0f;
      for (size_t j = 0; j < keys[r]; ++j) {
        // (With extras, -inf marks a key the row does not see.)
        if (extras && s.s[r * kKeyBlock + j] == kNegInf) continue;
        sum += Bf16ToF32(s.p[r * kKeyBlock + j]) * Bf16ToF32(s.vp[(j / 2) * 2 * s.Lv + 2 * n + (j & 1)]);
      }
      acc_r[n] = s.saved[i * s.Lv + n] * s.corr[r0 + r] + sum;
    }
  }
}

void AttentionRows(const AttnDims& a, const AttnViews& v, size_t b, size_t h, size_t i0,
                   size_t i1, size_t key_begin, size_t key_end, float* partial, float* scratch) {
  const Scratch s = Carve(a, scratch);
  const size_t L = a.head_dim, rows = i1 - i0, g = h / a.group();
  const float scale2 = a.scale * 1.44269504088896341f;
  PackQ(v.q, b, h, i0, rows, L, s.Lp, s.qp);
  memset(s.acc, 0, rows * s.Lv * sizeof(float));
  for (size_t r = 0; r < rows; ++r) {
    s.m[r] = kNegInf;
    s.l[r] = 0.0f;
  }
  const size_t last_visible = a.visible_keys(i1 - 1);
  const size_t keys_needed = MinSize(last_visible, key_end);
  // Under a window, the blocks before the first row's first key are skipped.
  const size_t first = a.first_key(i0);
  for (size_t j0 = first > key_begin ? first : key_begin; j0 < keys_needed; j0 += kKeyBlock) {
    const size_t nj = MinSize(kKeyBlock, keys_needed - j0);
    PackKT(v.k, b, g, j0, nj, L, s.Lp, s.tmp, s.kt);
    const bool v_nonfinite = PackVPairs(v.v, b, g, j0, nj, L, s.Lv, s.tmp, s.vp);
    for (size_t r0 = 0; r0 < rows; r0 += 4) {
      switch (MinSize(4, rows - r0)) {
        case 4: Group<4>(a, s, b, h, i0, r0, j0, nj, scale2, v_nonfinite); break;
        case 3: Group<3>(a, s, b, h, i0, r0, j0, nj, scale2, v_nonfinite); break;
        case 2: Group<2>(a, s, b, h, i0, r0, j0, nj, scale2, v_nonfinite); break;
        default: Group<1>(a, s, b, h, i0, r0, j0, nj, scale2, v_nonfinite); break;
      }
    }
  }
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
    // A sink joins the denominator (SinkFactor).
    const float inv = a.opt != nullptr && a.opt->sinks != nullptr
                          ? SinkFactor(s.m[r], l, kLog2e * a.opt->sinks[a.query_head(h, i0 + r)])
                          : l > 0.0f ? 1.0f / l : (l == 0.0f ? 0.0f : l);
    for (size_t n = 0; n < L; ++n) s.row[n] = acc_r[n] * inv;
    StoreRow(s.row, L, v.out.dtype, v.out.Row(b, h, i0 + r));
  }
}

// One group of R rows x one panel (8 vectors of 4 columns, in two halves).
template <int R>
void ProjectGroupPanel(const uint16_t* op, size_t Kp, const uint16_t* panel, float* out) {
  for (int half = 0; half < 2; ++half) {
    float32x4_t acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = vdupq_n_f32(0.0f);
    const uint32_t* o32 = reinterpret_cast<const uint32_t*>(op);
    for (size_t q = 0; q < Kp / 2; ++q) {
      uint32x4_t w[4];
      for (int c = 0; c < 4; ++c)
        w[c] = vld1q_u32(reinterpret_cast<const uint32_t*>(panel + q * 64 + 32 * half + 8 * c));
      for (int r = 0; r < R; ++r) {
        const uint32_t pair = o32[r * (Kp / 2) + q];
        for (int c = 0; c < 4; ++c) acc[r][c] = Dot(acc[r][c], pair, w[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) vst1q_f32(out + r * kPanelCols + 16 * half + 4 * c, acc[r][c]);
  }
}

#pragma GCC pop_options

size_t ProjScratch(const ProjDims& p) {
  return kProjRows * InnerPadded(p) / 2 + 4 * kPanelCols + kPanelCols + 16;
}

void PackWo(const ProjDims& p, const TensorView& wo, uint16_t* packed, size_t panel0,
            size_t panel1) {
  const size_t K = p.inner(), Kp = InnerPadded(p), D = p.model_dim;
  uint16_t row0[kPanelCols], row1[kPanelCols];
  for (size_t panel = panel0; panel < panel1; ++panel) {
    const size_t c0 = panel * kPanelCols, n = MinSize(kPanelCols, D - c0);
    uint16_t* dst = packed + panel * Kp * kPanelCols;
    for (size_t q = 0; q < Kp / 2; ++q) {
      memset(row0, 0, sizeof(row0));
      memset(row1, 0, sizeof(row1));
      const size_t bytes = DTypeBytes(wo.dtype);
      if (2 * q < K) RowToBf16(wo.Row(0, 0, 2 * q) + c0 * bytes, wo.dtype, n, row0);
      if (2 * q + 1 < K) RowToBf16(wo.Row(0, 0, 2 * q + 1) + c0 * bytes, wo.dtype, n, row1);
      for (size_t c = 0; c < kPanelCols; ++c) {
        dst[q * 64 + 2 * c] = row0[c];
        dst[q * 64 + 2 * c + 1] = row1[c];
      }
    }
  }
}

void ProjectRows(const ProjDims& p, const TensorView& heads, const uint16_t* packed_wo,
                 const float* bias, const TensorView& y, size_t b, size_t s0, size_t s1,
                 size_t panel0, size_t panel1, float* scratch) {
  const size_t Kp = InnerPadded(p), rows = s1 - s0, L = p.head_dim;
  uint16_t* op = reinterpret_cast<uint16_t*>(scratch);
  float* tile = scratch + kProjRows * Kp / 2;
  float* row = tile + 4 * kPanelCols;
  for (size_t r = 0; r < rows; ++r) {
    uint16_t* dst = op + r * Kp;
    memset(dst, 0, Kp * sizeof(uint16_t));
    for (size_t h = 0; h < p.heads; ++h) RowToBf16(heads.Row(b, h, s0 + r), heads.dtype, L, dst + h * L);
  }
  for (size_t panel = panel0; panel < panel1; ++panel) {
    const uint16_t* w = packed_wo + panel * Kp * kPanelCols;
    const size_t c0 = panel * kPanelCols, n = MinSize(kPanelCols, p.model_dim - c0);
    for (size_t r = 0; r < rows; r += 4) {
      const size_t g = MinSize(4, rows - r);
      const uint16_t* o = op + r * Kp;
      switch (g) {
        case 4: ProjectGroupPanel<4>(o, Kp, w, tile); break;
        case 3: ProjectGroupPanel<3>(o, Kp, w, tile); break;
        case 2: ProjectGroupPanel<2>(o, Kp, w, tile); break;
        default: ProjectGroupPanel<1>(o, Kp, w, tile); break;
      }
      for (size_t i = 0; i < g; ++i) {
        for (size_t c = 0; c < n; ++c) row[c] = tile[i * kPanelCols + c] + (bias ? bias[c0 + c] : 0.0f);
        StoreRow(row, n, y.dtype, y.Row(b, 0, s0 + r + i) + c0 * DTypeBytes(y.dtype));
      }
    }
  }
}

bool Runs() { return CpuHasArmBf16(); }

}  // namespace

const Path* NeonBf16Path() {
  static const Path path = {"NEON_BF16", Runs, ScratchFloats, AttentionRows,
                            PackWo,      ProjScratch, ProjectRows, /*takes_options=*/true};
  return &path;
}

}  // namespace native
}  // namespace headsum

#endif  // __aarch64__
