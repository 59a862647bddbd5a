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

headsum_status PagedKvWrite(const PagedBatch& p, const TensorView& k_new,
                            const TensorView& v_new) {
  const auto kernel = HWY_DISPATCH_TABLE(ConvertRows)[TableIndex(ActiveTarget())];
  const size_t elem = DTypeBytes(p.k.dtype);
  // Sequence by sequence, its new rows block by block: each run of slots
  // `slot stride` apart is one [1][Hkv][n][L] conversion.
  for (size_t b = 0; b < p.batch; ++b) {
    const size_t t0 = static_cast<size_t>(p.q_offsets[b]);
    const size_t n = static_cast<size_t>(p.q_offsets[b + 1]) - t0;
    const size_t first = static_cast<size_t>(p.kv_lens[b]) - n;
    const int32_t* table = p.block_table + b * p.blocks_per_seq;
    for (size_t i = 0; i < n;) {
      const size_t pos = first + i;
      const size_t run = HWY_MIN(n - i, p.block_rows - pos % p.block_rows);
      const size_t offset = static_cast<size_t>(table[pos / p.block_rows]) * p.block_stride +
                            (pos % p.block_rows) * p.k.ss;
      const size_t dims[4] = {1, p.kv_heads, run, p.head_dim};
      for (int kv = 0; kv < 2; ++kv) {
        const TensorView& src_all = kv == 0 ? k_new : v_new;
        const TensorView& pool = kv == 0 ? p.k : p.v;
        TensorView src = src_all, dst = pool;
        src.data = src_all.Row(0, 0, t0 + i);
        dst.data = static_cast<char*>(pool.data) + offset * elem;
        dst.sb = 0;
        kernel(dims, src, dst, 0, p.kv_heads * run);
      }
      i += run;
    }
  }
  return HEADSUM_OK;
}

}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
