// rope: rotary position embedding, rotate-half (as Llama), in place.  Each
// row x of head_dim L = 2 * half is turned by the angles of its position:
//   x[i]        <- x[i] cos_i - x[i + half] sin_i
//   x[i + half] <- x[i + half] cos_i + x[i] sin_i          (i < half)
// with cos_i, sin_i of pos * theta^(-2i/L) from a table the caller computed
// once (layer/rope_table.h), so no trigonometry runs here.

#if defined(HEADSUM_KERNELS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ROPE_INL_H_
#undef HEADSUM_KERNELS_ROPE_INL_H_
#else
#define HEADSUM_KERNELS_ROPE_INL_H_
#endif

#include <stddef.h>

#include "kernels/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Rotates `rows` rows of 2 * half floats, row r at x + r * row_stride, all by
// the same angles: cos_sin = [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}].
// Each element is one product and one multiply-add (fused where the target
// has FMA): whole vectors and single-lane tails do the same arithmetic, so
// the result does not depend on where a row's tail starts.
inline void RotateHalfRows(float* HWY_RESTRICT x, size_t rows, size_t row_stride,
                           size_t half, const float* HWY_RESTRICT cos_sin) {
  const float* HWY_RESTRICT cos = cos_sin;
  const float* HWY_RESTRICT sin = cos_sin + half;
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT lo = x + r * row_stride;
    float* HWY_RESTRICT hi = lo + half;
    ForEachVector(half, [&](auto d, size_t i) {
      const auto c = hn::LoadU(d, cos + i), s = hn::LoadU(d, sin + i);
      const auto x_lo = hn::LoadU(d, lo + i), x_hi = hn::LoadU(d, hi + i);
      hn::StoreU(hn::NegMulAdd(x_hi, s, hn::Mul(x_lo, c)), d, lo + i);
      hn::StoreU(hn::MulAdd(x_lo, s, hn::Mul(x_hi, c)), d, hi + i);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ROPE_INL_H_
