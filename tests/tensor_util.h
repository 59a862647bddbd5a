// The tensor tests' helpers (tests/tensor_test.cc, tests/variants_test.cc):
// independent 16-bit conversions, strided buffers, the attention cases and
// dtype combinations, and the bound of an attention on views.
//
// Bounds.  A 16-bit input is widened exactly, so the kernel computes on the
// rounded values the reference also gets: the f32 bounds of error_bounds.h
// apply unchanged.  A 16-bit output is the f32 result rounded once to
// nearest: |out - exact| <= b32 + u16 (|exact| + b32) (+ half the f16
// subnormal spacing, 2^-25, for f16), u16 the unit roundoff (bf16: 2^-8,
// f16: 2^-11).
#ifndef HEADSUM_TESTS_TENSOR_UTIL_H_
#define HEADSUM_TESTS_TENSOR_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "test_util.h"

namespace headsum_test {

// ---------------------------------------------------------------------------
// Independent 16-bit conversions.

// 2^k, exactly, for |k| <= 1000 (the values here are floats' and their
// scalings); and floor(log2 |x|) of a normal double (every float is one),
// read from its exponent field.  (std::ldexp and std::ilogb, with their
// range and errno handling, were most of the tensor tests' time.)
inline double Pow2(int k) {
  if (k < -1000 || k > 1000) return std::ldexp(1.0, k);
  const uint64_t bits = static_cast<uint64_t>(k + 1023) << 52;
  double p;
  memcpy(&p, &bits, 8);
  return p;
}
inline int Log2Floor(double x) {
  uint64_t bits;
  memcpy(&bits, &x, 8);
  const int biased = static_cast<int>((bits >> 52) & 0x7FF);
  return biased == 0 ? std::ilogb(x) : biased - 1023;
}

inline double F16ToDouble(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = static_cast<double>(m) * Pow2(-24);
  } else {
    v = static_cast<double>(m + 1024) * Pow2(e - 25);
  }
  return sign ? -v : v;
}

inline double BF16ToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// x (a float's value) rounded to `mantissa` significant bits (implicit one
// included) with exponents down to min_exp (below it, fixed spacing
// 2^(min_exp - mantissa + 1)), ties to even, in double whatever the
// rounding mode: the integer part by floor, the fraction exactly (scaled -
// floor(scaled): by Sterbenz's lemma when the floor is 1 or more, scaled
// itself when it is 0) compared with one half.  (Not nearbyint: setting and
// restoring the mode around it made the encoding most of some tests' time
// under qemu.)  Scaling by powers of two is exact in this range.
inline double RoundToPrecision(double x, int mantissa, int min_exp) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  int e = Log2Floor(x);
  if (e < min_exp) e = min_exp;
  const double scaled = std::fabs(x) * Pow2(mantissa - 1 - e);  // exact
  double r = std::floor(scaled);
  const double fraction = scaled - r;  // exact
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  return std::copysign(r * Pow2(e - (mantissa - 1)), x);
}

inline uint16_t DoubleToF16Bits(double x) {  // x: a float's value
  if (std::isnan(x)) return 0x7E00;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double r = RoundToPrecision(std::fabs(x), 11, -14);
  if (r > 65504.0) return sign | 0x7C00;
  if (r == 0) return sign;
  // encode the representable r
  int e = Log2Floor(r);
  if (e < -14) return sign | static_cast<uint16_t>(r * Pow2(24));  // subnormal
  const int m = static_cast<int>(r * Pow2(10 - e)) - 1024;
  return sign | static_cast<uint16_t>(((e + 15) << 10) | m);
}

inline uint16_t DoubleToBF16Bits(double x) {  // x: a float's value
  if (std::isnan(x)) return 0x7FC0;
  const double r = RoundToPrecision(x, 8, -126);
  if (std::fabs(r) > 3.3895313892515355e38) return std::signbit(x) ? 0xFF80 : 0x7F80;
  const float f = static_cast<float>(r);  // exact: r is a bf16 value
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

inline double DecodeElement(const char* p, headsum_dtype t) {
  if (t == HEADSUM_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return t == HEADSUM_F16 ? F16ToDouble(h) : BF16ToDouble(h);
}

inline void EncodeElement(double v, char* p, headsum_dtype t) {
  if (t == HEADSUM_F32) {
    const float f = static_cast<float>(v);
    memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = t == HEADSUM_F16 ? DoubleToF16Bits(v) : DoubleToBF16Bits(v);
  memcpy(p, &h, 2);
}

inline size_t Bytes(headsum_dtype t) { return t == HEADSUM_F32 ? 4 : 2; }
inline const char* DtypeName(headsum_dtype t) {
  return t == HEADSUM_F32 ? "f32" : t == HEADSUM_F16 ? "f16" : "bf16";
}

// Unit roundoff of a 16-bit output (0 for f32: no rounding after the f32 result).
inline double OutputRoundoff(headsum_dtype t) {
  return t == HEADSUM_BF16 ? std::ldexp(1.0, -8) : t == HEADSUM_F16 ? std::ldexp(1.0, -11) : 0;
}
inline double OutputAbsFloor(headsum_dtype t) { return t == HEADSUM_F16 ? std::ldexp(1.0, -25) : 0; }

// ---------------------------------------------------------------------------
// Strided buffers.

// A byte buffer holding a [n0][n1][n2][n3] view with given strides (in
// elements), the rest of it filled with a fill pattern.
struct Strided {
  std::vector<char> bytes;  // owns the memory, with `offset` bytes of slack before
  size_t offset = 0;        // of element (0,0,0,0) in bytes
  headsum_dtype dtype = HEADSUM_F32;
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t strides[3] = {0, 0, 0};

  char* base() { return bytes.data() + offset; }
  char* at(int64_t b, int64_t h, int64_t s, int64_t l) {
    return base() + (b * strides[0] + h * strides[1] + s * strides[2] + l) * Bytes(dtype);
  }
  headsum_tensor tensor() {
    headsum_tensor t;
    t.data = base();
    t.dtype = dtype;
    for (int i = 0; i < 3; ++i) t.strides[i] = strides[i];
    return t;
  }
  // Writes logical [n0][n1][n2][n3] values (contiguous f32), rounded to dtype.
  void Fill(const std::vector<float>& v) {
    size_t n = 0;
    for (int64_t b = 0; b < dims[0]; ++b)
      for (int64_t h = 0; h < dims[1]; ++h)
        for (int64_t s = 0; s < dims[2]; ++s)
          for (int64_t l = 0; l < dims[3]; ++l) EncodeElement(v[n++], at(b, h, s, l), dtype);
  }
  // Reads the logical values back as f32.
  std::vector<float> Read() {
    std::vector<float> v;
    for (int64_t b = 0; b < dims[0]; ++b)
      for (int64_t h = 0; h < dims[1]; ++h)
        for (int64_t s = 0; s < dims[2]; ++s)
          for (int64_t l = 0; l < dims[3]; ++l)
            v.push_back(static_cast<float>(DecodeElement(at(b, h, s, l), dtype)));
    return v;
  }
};

// A buffer of `elements` elements of dtype, every byte `fill` (0xFF: NaN in
// every dtype), with 2 spare bytes before so that data can start 2 or 4
// bytes off any larger boundary.
inline std::vector<char> Buffer(size_t elements, headsum_dtype t, unsigned char fill) {
  return std::vector<char>(elements * Bytes(t) + 64, static_cast<char>(fill));
}

inline Strided MakeView(headsum_dtype t, const int64_t dims[4], const int64_t strides[3],
                 size_t elements, unsigned char fill) {
  Strided s;
  s.dtype = t;
  for (int i = 0; i < 4; ++i) s.dims[i] = dims[i];
  for (int i = 0; i < 3; ++i) s.strides[i] = strides[i];
  s.bytes = Buffer(elements, t, fill);
  s.offset = 16 + Bytes(t);  // off every vector boundary, aligned to the element
  return s;
}

// Views of one [B][N][S][L] tensor.
enum class Layout4 { kBhsd, kBshd };
inline Strided Make4(headsum_dtype t, Layout4 layout, int64_t B, int64_t N, int64_t S, int64_t L,
              unsigned char fill) {
  const int64_t dims[4] = {B, N, S, L};
  int64_t st[3];
  if (layout == Layout4::kBhsd) {
    st[0] = N * S * L; st[1] = S * L; st[2] = L;
  } else {
    st[0] = S * N * L; st[1] = L; st[2] = N * L;
  }
  return MakeView(t, dims, st, size_t(B * N * S * L), fill);
}

// ---------------------------------------------------------------------------
// Attention on views.

struct DtypeCombo {
  headsum_dtype q, kv, out;
  headsum_dtype v;  // of V: kv unless set apart
};
inline const DtypeCombo kCombos[] = {
    {HEADSUM_F32, HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},
    {HEADSUM_F32, HEADSUM_F16, HEADSUM_F32, HEADSUM_F16},
    {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F32, HEADSUM_BF16},
    {HEADSUM_F16, HEADSUM_F16, HEADSUM_F16, HEADSUM_F16},
    {HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16},
    {HEADSUM_F32, HEADSUM_F32, HEADSUM_BF16, HEADSUM_F32},
    {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F16, HEADSUM_BF16},
    {HEADSUM_F32, HEADSUM_F16, HEADSUM_F32, HEADSUM_BF16},  // K and V of different dtypes
    {HEADSUM_BF16, HEADSUM_F32, HEADSUM_F32, HEADSUM_F16},
};

enum class AttnLayout { kContiguous, kTokenMajor, kFusedQkv, kCache };
inline const char* LayoutName(AttnLayout l) {
  switch (l) {
    case AttnLayout::kContiguous: return "bhsd";
    case AttnLayout::kTokenMajor: return "bshd";
    case AttnLayout::kFusedQkv: return "fused-qkv";
    default: return "kv-cache";
  }
}

struct AttnCase {
  int64_t b, h, hkv, sq, skv, l;
  bool causal;
};
inline const AttnCase kAttnCases[] = {
    {1, 8, 8, 20, 20, 64, false},   // the seed
    {1, 8, 8, 20, 20, 64, true},
    {2, 3, 3, 17, 17, 3, false},    // odd head dim
    {1, 4, 2, 3, 65, 17, true},     // GQA, causal with Sq < Skv (dot path)
    {1, 2, 2, 5, 40, 16, true},     // 5 rows: keys-in-lanes path on wide targets
    {2, 4, 2, 65, 130, 33, true},   // two query blocks, several key tiles
    {1, 4, 1, 1, 1100, 63, false},  // MQA decode, key splits
    {1, 8, 2, 1, 1030, 64, false},  // GQA decode, key splits
    {1, 2, 2, 1, 1, 1, false},
    // MHA decode rows read in their aligned frame (f32 K/V off 64 bytes,
    // L = 64 or 128): key splits, causal Sq < Skv.
    {1, 4, 4, 1, 1030, 64, false},
    {1, 2, 2, 2, 300, 128, true},
    // A grouped decode step (four query heads on one kv head) over bf16
    // K/V read as element pairs (L a multiple of two vectors: 128
    // everywhere, 48 below 512-bit vectors only): two key tiles, the last
    // with an odd key count (512 + 19 keys).
    {1, 4, 1, 1, 531, 128, false},
    {1, 4, 1, 1, 45, 48, false},
    // MHA decode steps over 16-bit K/V counted as read from memory run on
    // FlashAttentionRowStream where L is 1-8 vectors: L = 2 and 3 vectors
    // (AVX-512), 8 and 6 (NEON); key counts off its 16-key tiles.  On AVX2,
    // SSE4 and SSSE3 (FlashAttentionRowStreamNarrow, any number of vectors)
    // L = 80 is 10 and 20 vectors: P V blocks of eight and a shorter one,
    // the dot's four chains and a remainder.
    {1, 3, 3, 1, 77, 32, false},
    {1, 2, 2, 1, 50, 48, false},
    {1, 2, 2, 1, 41, 24, false},
    {1, 2, 2, 1, 37, 80, false},
};

struct AttnBuffers {
  Strided q, k, v, out;
  // fused: q, k, v share q's bytes
  std::vector<char> fused;
};

// Builds q, k, v, out views of the layout and writes the logical values.
inline AttnBuffers MakeAttnBuffers(const AttnCase& c, const DtypeCombo& t, AttnLayout layout,
                            const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v) {
  AttnBuffers bufs;
  const int64_t B = c.b, H = c.h, G = c.hkv, Sq = c.sq, Skv = c.skv, L = c.l;
  if (layout == AttnLayout::kContiguous || layout == AttnLayout::kTokenMajor) {
    const Layout4 l4 = layout == AttnLayout::kContiguous ? Layout4::kBhsd : Layout4::kBshd;
    bufs.q = Make4(t.q, l4, B, H, Sq, L, 0xFF);
    bufs.k = Make4(t.kv, l4, B, G, Skv, L, 0xFF);
    bufs.v = Make4(t.v, l4, B, G, Skv, L, 0xFF);
    bufs.out = Make4(t.out, l4, B, H, Sq, L, 0xA5);
  } else if (layout == AttnLayout::kCache) {
    // K/V: [B][G][cap][L] with cap > Skv; the unfilled tail holds NaN.
    const int64_t cap = Skv + 7;
    const int64_t dims[4] = {B, G, Skv, L}, st[3] = {G * cap * L, cap * L, L};
    bufs.q = Make4(t.q, Layout4::kBshd, B, H, Sq, L, 0xFF);
    bufs.k = MakeView(t.kv, dims, st, size_t(B * G * cap * L), 0xFF);
    bufs.v = MakeView(t.v, dims, st, size_t(B * G * cap * L), 0xFF);
    bufs.out = Make4(t.out, Layout4::kBhsd, B, H, Sq, L, 0xA5);
  } else {
    // One token-major buffer [B][S][H + 2G][L] (Sq = Skv here: self-attention)
    // seen as q, k and v; all one dtype (q's), out token-major.
    const int64_t W = (H + 2 * G) * L;
    const int64_t q_dims[4] = {B, H, Sq, L}, kv_dims[4] = {B, G, Skv, L};
    const int64_t st[3] = {Skv * W, L, W};
    bufs.q = MakeView(t.q, q_dims, st, size_t(B * Skv * W), 0xFF);
    bufs.k = bufs.q;  // same bytes: the views below point into q's
    bufs.v = bufs.q;
    bufs.k.dims[1] = kv_dims[1], bufs.k.dims[2] = Skv;
    bufs.v.dims[1] = kv_dims[1], bufs.v.dims[2] = Skv;
    bufs.k.offset = bufs.q.offset + size_t(H * L) * Bytes(t.q);
    bufs.v.offset = bufs.q.offset + size_t((H + G) * L) * Bytes(t.q);
    bufs.out = Make4(t.out, Layout4::kBshd, B, H, Sq, L, 0xA5);
    // Fill q, k, v into one byte array: write through q's buffer.
    bufs.q.Fill(q);
    Strided kv = bufs.q;
    kv.dims[1] = G;
    kv.dims[2] = Skv;
    kv.offset = bufs.k.offset;
    kv.Fill(k);
    kv.offset = bufs.v.offset;
    kv.Fill(v);
    bufs.q.bytes = kv.bytes;  // q's bytes, with k and v written in
    return bufs;
  }
  bufs.q.Fill(q);
  bufs.k.Fill(k);
  bufs.v.Fill(v);
  return bufs;
}

// Values as the kernel sees them after widening: rounded to dtype.
inline std::vector<float> RoundedTo(const std::vector<float>& x, headsum_dtype t) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    char e[4];
    EncodeElement(x[i], e, t);
    r[i] = static_cast<float>(DecodeElement(e, t));
  }
  return r;
}

// A case's shape and element counts.
inline headsum_attn_shape ShapeOf(const AttnCase& c) {
  return {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
}
inline size_t QueryElements(const AttnCase& c) { return size_t(c.b * c.h * c.sq * c.l); }
inline size_t KvElements(const AttnCase& c) { return size_t(c.b * c.hkv * c.skv * c.l); }

// The bound of an attention on views of dtypes t: the f32 bound (plus P's
// rounding to bf16 where a native bf16 path computes it), then a 16-bit
// output's one rounding.
inline std::vector<double> TensorAttentionBound(const RefAttnDims& d, const std::vector<float>& q,
                                         const std::vector<float>& k,
                                         const std::vector<float>& v,
                                         const std::vector<double>& ref, const DtypeCombo& t) {
  std::vector<double> bound = AttentionBound(d, q.data(), k.data(), v.data());
  if (NativeBf16Active() && t.q == HEADSUM_BF16 && t.kv == HEADSUM_BF16) {
    // A native bf16 path computes it: P rounded to bf16 (error_bounds.h).
    const std::vector<double> pv = NativeBf16PvBound(d, q.data(), k.data(), v.data());
    for (size_t i = 0; i < bound.size(); ++i) bound[i] += pv[i];
  }
  const double u16 = OutputRoundoff(t.out), floor16 = OutputAbsFloor(t.out);
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] += u16 * (std::fabs(ref[i]) + bound[i]) + floor16;
  }
  return bound;
}


}  // namespace headsum_test

#endif  // HEADSUM_TESTS_TENSOR_UTIL_H_
