// 16-bit floats in and out of the f32 kernels: widening (exact) and
// narrowing (rounded to nearest even, once), vectorized with integer ops so
// that every target gives the same bits.  Highway 1.0.3's own conversions
// are not used for this: its f32 -> bf16 DemoteTo truncates, and its f16
// conversions without F16C (SSE4, SSSE3) truncate, clamp instead of giving
// inf, and lose NaN.
//   f16 -> f32: exact, subnormals, inf and NaN included.
//   f32 -> f16: round to nearest even; beyond f16's range (>= 65520 in
//               magnitude) inf; NaN stays a (quiet) NaN; -0 keeps its sign;
//               results in f16's subnormal range rounded at 2^-24.
//   bf16 -> f32: the 16 bits shifted up (exact).
//   f32 -> bf16: round to nearest even; NaN stays a (quiet) NaN.

#if defined(HEADSUM_KERNELS_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_CONVERT_INL_H_
#undef HEADSUM_KERNELS_CONVERT_INL_H_
#else
#define HEADSUM_KERNELS_CONVERT_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hwy/highway.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// f32 lanes of d from 16-bit patterns zero-extended into u32 lanes.
template <class D, class VU>
HWY_INLINE hn::Vec<D> F32FromF16Bits(D df, VU h) {
  const hn::RebindToUnsigned<D> du;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  auto o = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu)));  // exponent, mantissa
  const auto exp = hn::And(o, hn::Set(du, 0x0F800000u));          // 0x7C00 << 13
  o = hn::Add(o, hn::Set(du, 0x38000000u));                       // rebias 15 -> 127
  // inf / NaN: exponent all ones in f32 too.
  o = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 0x0F800000u)), hn::Add(o, hn::Set(du, 0x38000000u)),
                     o);
  // zero / subnormal: m * 2^-24, as (2^-14 (1 + m/1024)) - 2^-14, exact.
  const auto sub = hn::BitCast(
      du, hn::Sub(hn::BitCast(df, hn::Add(o, hn::Set(du, 0x00800000u))),
                  hn::Set(df, 6.103515625e-05f)));
  o = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), sub, o);
  return hn::BitCast(df, hn::Or(o, sign));
}

// 16-bit patterns (in u32 lanes) of f32 lanes rounded to f16.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> F16BitsFromF32(D df, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto x = hn::BitCast(du, v);
  const auto sign = hn::And(x, hn::Set(du, 0x80000000u));
  const auto a = hn::Xor(x, sign);
  const auto ai = hn::BitCast(di, a);  // < 2^31: signed compares are exact
  // >= 65536: inf, or a quiet NaN.
  const auto big = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))),
                                  hn::Set(du, 0x7E00u), hn::Set(du, 0x7C00u));
  // Below 2^-14: add 0.5 so that the f32 addition rounds at 2^-24 (ties to
  // even), then the low bits are the f16 subnormal.
  const auto sub = hn::Sub(
      hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))), hn::Set(du, 0x3F000000u));
  // Normal: rebias, round to nearest even at bit 13.  [65520, 65536) carries
  // into the exponent and gives inf, as it should.
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const auto normal =
      hn::ShiftRight<13>(hn::Add(hn::Add(a, hn::Set(du, 0xC8000FFFu)), odd));
  auto o = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
  o = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x47800000))), o, big);
  return hn::Or(o, hn::ShiftRight<16>(sign));
}

// 16-bit patterns (in u32 lanes) of f32 lanes rounded to bf16.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> BF16BitsFromF32(D /*df*/, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto x = hn::BitCast(du, v);
  const auto a = hn::BitCast(di, hn::And(x, hn::Set(du, 0x7FFFFFFFu)));
  const auto nan = hn::RebindMask(du, hn::Gt(a, hn::Set(di, 0x7F800000)));
  const auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
  const auto rounded = hn::Add(hn::Add(x, hn::Set(du, 0x7FFFu)), odd);
  return hn::ShiftRight<16>(hn::IfThenElse(nan, hn::Or(x, hn::Set(du, 0x00400000u)), rounded));
}

// Loads lanes of d as f32 from f32, f16 or bf16 memory.
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const float* HWY_RESTRICT p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const hwy::float16_t* HWY_RESTRICT p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // F16C: exact, as the integer path.
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, p));
#else
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du;
  return F32FromF16Bits(d, hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p))));
#endif
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du;
  const auto bits = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(d, hn::ShiftLeft<16>(bits));
}

// Stores f32 lanes of d as f32, f16 or bf16 (rounded to nearest even).
template <class D>
HWY_INLINE void StoreF32As(D d, hn::Vec<D> v, float* HWY_RESTRICT p) {
  hn::StoreU(v, d, p);
}
template <class D>
HWY_INLINE void StoreF32As(D d, hn::Vec<D> v, hwy::float16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToSigned<D> di;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, F16BitsFromF32(d, v))), du16,
             reinterpret_cast<uint16_t*>(p));
}
template <class D>
HWY_INLINE void StoreF32As(D d, hn::Vec<D> v, hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToSigned<D> di;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, BF16BitsFromF32(d, v))), du16,
             reinterpret_cast<uint16_t*>(p));
}

// Calls f(d, i) for i = 0, N, 2N... with full vectors, then single lanes
// (no access past n).  Shared with matmul-inl.h, which includes this file.
template <class F>
HWY_INLINE void ForEachVector(size_t n, const F& f) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) f(d, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) f(d1, i);
}

template <class TS, class TD>
HWY_INLINE void ConvertRowT(const TS* HWY_RESTRICT src, size_t n, TD* HWY_RESTRICT dst) {
  ForEachVector(n, [&](auto d, size_t i) { StoreF32As(d, LoadF32(d, src + i), dst + i); });
}

// Runs f with `p` cast to the element type of `t`.
template <class F>
HWY_INLINE void WithElementType(DType t, const void* p, const F& f) {
  switch (t) {
    case DType::kF16: f(static_cast<const hwy::float16_t*>(p)); break;
    case DType::kBF16: f(static_cast<const hwy::bfloat16_t*>(p)); break;
    default: f(static_cast<const float*>(p)); break;
  }
}
template <class F>
HWY_INLINE void WithMutableElementType(DType t, void* p, const F& f) {
  switch (t) {
    case DType::kF16: f(static_cast<hwy::float16_t*>(p)); break;
    case DType::kBF16: f(static_cast<hwy::bfloat16_t*>(p)); break;
    default: f(static_cast<float*>(p)); break;
  }
}

// n elements of dtype `ts` at src to dtype `td` at dst; the same dtype is a
// copy (bit for bit: NaN payloads kept).
HWY_INLINE void ConvertRow(const void* HWY_RESTRICT src, DType ts, size_t n,
                           void* HWY_RESTRICT dst, DType td) {
  if (ts == td) {
    memcpy(dst, src, n * DTypeBytes(ts));
    return;
  }
  WithElementType(ts, src, [&](const auto* s) {
    WithMutableElementType(td, dst, [&](auto* o) { ConvertRowT(s, n, o); });
  });
}

// rows x n elements of dtype t (row stride lds elements, from byte address
// src) widened into dst (row stride ldd floats).
HWY_INLINE void WidenRows(const char* HWY_RESTRICT src, DType t, size_t lds, size_t rows,
                          size_t n, float* HWY_RESTRICT dst, size_t ldd) {
  const size_t bytes = DTypeBytes(t);
  for (size_t r = 0; r < rows; ++r) {
    ConvertRow(src + r * lds * bytes, t, n, dst + r * ldd, DType::kF32);
  }
}

// An f32 row narrowed (or copied) to dtype t at byte address dst.
HWY_INLINE void StoreRow(const float* HWY_RESTRICT src, size_t n, char* HWY_RESTRICT dst,
                         DType t) {
  ConvertRow(src, DType::kF32, n, dst, t);
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_CONVERT_INL_H_
