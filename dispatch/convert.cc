// Exports headsum_convert's row conversion for every compiled target and
// splits a large conversion across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Rows [r0, r1) of the [nb][nh][ns] rows of nl elements, row index r =
// (b * nh + h) * ns + s.
inline void ConvertRows(const size_t dims[4], const TensorView& src, const TensorView& dst,
                        size_t r0, size_t r1) {
  for (size_t r = r0; r < r1; ++r) {
    const size_t s = r % dims[2], h = r / dims[2] % dims[1], b = r / dims[2] / dims[1];
    ConvertRow(src.Row(b, h, s), src.dtype, dims[3], dst.Row(b, h, s), dst.dtype);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "dispatch/ops.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"

namespace headsum {
HWY_EXPORT(ConvertRows);

namespace dispatch {

headsum_status Convert(const size_t dims[4], const TensorView& src, const TensorView& dst) {
  const auto kernel = HWY_DISPATCH_TABLE(ConvertRows)[TableIndex(ActiveTarget())];
  const size_t rows = dims[0] * dims[1] * dims[2];
  // Appending a few tokens to a cache runs on the calling thread; large
  // conversions in blocks of about 256 K elements across threads.
  constexpr size_t kBlockElements = size_t{1} << 18;
  const size_t block = HWY_MAX(size_t{1}, kBlockElements / dims[3]);
  if (rows <= block) {
    kernel(dims, src, dst, 0, rows);
    return HEADSUM_OK;
  }
  return ParallelItems((rows + block - 1) / block, 0, [&](size_t item, float*) {
    kernel(dims, src, dst, item * block, HWY_MIN(rows, (item + 1) * block));
  });
}

}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
