// Key splits: when one query block cannot keep the threads busy (decode),
// dispatch splits the keys into fixed ranges, each block path writes partial
// records (acc, m, l) per row, and MergeKeySplits combines them in key order.

#if defined(HEADSUM_KERNELS_ATTENTION_KEY_SPLIT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_KEY_SPLIT_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_KEY_SPLIT_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_KEY_SPLIT_INL_H_
#endif

#include "kernels/attention/common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Combines the partials of `splits` key ranges (in their order, so the result
// does not depend on which thread ran which range) into one row:
//   M = max_c m_c,  O = sum_c 2^(m_c - M) acc_c / sum_c 2^(m_c - M) l_c
// (m in base 2, as the kernels carry the scores).  rec: the row's record of
// the first split, the next split's `split_stride` floats further.  A NaN m
// marks a NaN row.
// sink2: the row's sink (base 2) as one more term of the denominator, or
// -inf for none.
inline void MergeKeySplitsRow(size_t L, const float* HWY_RESTRICT rec0, size_t split_stride,
                              size_t splits, float* HWY_RESTRICT o_r, float sink2) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m_all = kNegInf;
  bool nan = false;
  for (size_t c = 0; c < splits; ++c) {
    const float m = rec0[c * split_stride + L];
    nan |= std::isnan(m);
    m_all = HWY_MAX(m_all, m);
  }
  Fill(o_r, L, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
  if (nan || m_all == kNegInf) return;  // NaN row, or a row that saw no key
  m_all = HWY_MAX(m_all, sink2);
  float l_all = sink2 == kNegInf ? 0.0f : std::exp2(sink2 - m_all);
  for (size_t c = 0; c < splits; ++c) {
    const float* HWY_RESTRICT rec = rec0 + c * split_stride;
    if (rec[L] == kNegInf) continue;
    const float weight = std::exp2(rec[L] - m_all);
    l_all += weight * rec[L + 1];
    AddScaled(weight, rec, L, o_r);
  }
  ScaleRow(o_r, L, 1.0f / l_all);
}

// scratch of MergeKeySplits: one f32 row (a 16-bit output row before its
// rounding).
inline size_t MergeScratch(const AttnDims& a) { return a.head_dim; }

// Rows [i0, i1) of head (b, h) from partials [splits][i1 - i0][PartialFloats()].
inline void MergeKeySplits(const AttnDims& a, const float* HWY_RESTRICT partials,
                           size_t splits, const TensorView& out, size_t b, size_t h,
                           size_t i0, size_t i1, float* HWY_RESTRICT scratch) {
  const size_t L = a.head_dim, rows = i1 - i0, stride = PartialFloats(a);
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT o_r =
        out.IsF32() ? reinterpret_cast<float*>(out.Row(b, h, i0 + r)) : scratch;
    const float sink2 = a.opt != nullptr && a.opt->sinks != nullptr
                            ? 1.44269504088896341f * a.opt->sinks[a.query_head(h, i0 + r)]
                            : -std::numeric_limits<float>::infinity();
    MergeKeySplitsRow(L, partials + r * stride, rows * stride, splits, o_r, sink2);
    if (!out.IsF32()) StoreRow(o_r, L, out.Row(b, h, i0 + r), out.dtype);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_KEY_SPLIT_INL_H_
