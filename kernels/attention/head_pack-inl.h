// Head packing: a prefill over token-major (strided) or 16-bit K and V
// copies (widens) each kv head's rows once per thread into contiguous f32
// scratch, so every query block of the head reads the copy.  A schedule
// around the block paths, not a path of its own: dispatch runs the blocks
// on the packed views.

#if defined(HEADSUM_KERNELS_ATTENTION_HEAD_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_HEAD_PACK_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_HEAD_PACK_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_HEAD_PACK_INL_H_
#endif

#include "kernels/attention/common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Token-major K and V (a head's rows H*L elements apart, a fused QKV
// buffer 3*H*L) put two rows in each 4 KiB page, at the same offsets in
// every page: their lines fall in one eighth of the sets of each cache
// (L2 and L3 index by the low 12 address bits and the page's frame), so a
// head's keys and values, which every query block of the head reads again,
// drop out of the L3 between blocks (measured on Zen 1, S=2048: 0.81x of
// the contiguous speed; copying each tile into scratch cost as much, 12% of
// the call in its strided reads).  So the first query block of a head that
// a thread runs copies (widens) the head's strided or 16-bit K and V rows
// once into its scratch, contiguous, and every block of that head on the
// thread reads the copy.  Bounded per thread; past it the rows are read as
// without the copy (strided f32 in place, 16-bit widened tile by tile).
constexpr size_t kHeadPackMaxFloats = size_t{1} << 21;  // 8 MiB
// Floats before the copies: the tag (call, b, kv head) of what they hold.
constexpr size_t kHeadPackTagFloats = 16;

inline size_t RoundUpFloats(size_t n) { return (n + 15) / 16 * 16; }
// Strided rows, and 16-bit ones: widened once per head here rather than
// tile by tile for every query block (Zen 5, S=512 1 thread, medians of two
// alternated runs: f16 K/V 3403-3591 -> 3149-3217 us against f32's
// 3144-3424, bf16 3338-3730 -> 3159-3293 us; S=2048 causal f16 27940-28375
// -> 26067-26442 us).
// A paged cache's rows too (its blocks' rows are token-major).
inline bool PacksKvRows(const TensorView& t, size_t L, bool paged = false) {
  return paged || t.ss != L || !t.IsF32();
}

// Floats of the copies of one kv head's strided or 16-bit K and V rows (0: no copy).
// Only where a head has more than one query block to reuse them.
inline size_t HeadPackFloats(const AttnDims& a, const AttnViews& v) {
  const size_t L = a.head_dim;
  if (a.seq_q <= kQueryBlock) return 0;
  const size_t per = RoundUpFloats(a.seq_kv * L);
  const bool paged = v.pages.table != nullptr;
  const size_t floats =
      (PacksKvRows(v.k, L, paged) ? per : 0) + (PacksKvRows(v.v, L, paged) ? per : 0);
  return floats != 0 && floats <= kHeadPackMaxFloats ? floats : 0;
}

// Scratch of PackHeadViews.
inline size_t HeadPackedScratch(const AttnDims& a, const AttnViews& v) {
  return RoundUpFloats(AttentionScratch(a, v)) + kHeadPackTagFloats + HeadPackFloats(a, v);
}

// Rows [0, n) of t's head (b, g) as contiguous f32 rows of L at dst; the
// rows ahead prefetched (strided rows do not start the stream prefetcher).
// (A paged cache's rows block by block: KvRows::RowPtr.)
inline void PackHeadRows(const TensorView& t, const KvPages& pages, size_t b, size_t g,
                         size_t n, size_t L, float* HWY_RESTRICT dst) {
  constexpr size_t kAhead = 8;
  const size_t row_bytes = L * DTypeBytes(t.dtype);
  const KvRows rows{t.Row(b, g, 0), t.dtype, t.ss, nullptr, pages.table, pages.rows,
                    pages.stride * DTypeBytes(t.dtype)};
  for (size_t s = 0; s < n; ++s) {
    if (s + kAhead < n) PrefetchBytes(rows.RowPtr(s + kAhead), row_bytes);
    ConvertRow(rows.RowPtr(s), t.dtype, L, dst + s * L, DType::kF32);
  }
}

// The views of head (b, h) with its kv head's strided or 16-bit K/V rows
// read from this thread's copy (made here if the copy holds another head,
// or is from another call: `call` is unique per call).  The block paths
// then run on *packed with the same scratch (their part comes first).
HWY_NOINLINE void PackHeadViews(const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                                uint64_t call, float* HWY_RESTRICT scratch, AttnViews* packed) {
  const size_t L = a.head_dim, g = h / a.group();
  float* const tag_at = scratch + RoundUpFloats(AttentionScratch(a, views));
  float* pack = tag_at + kHeadPackTagFloats;
  const uint64_t tag[3] = {call, b, g};
  *packed = views;
  const bool paged = views.pages.table != nullptr;
  packed->pages = KvPages{};  // (a paged head's rows are all copied)
  const auto use = [&](TensorView& t) {
    if (!PacksKvRows(t, L, paged)) return static_cast<float*>(nullptr);
    float* rows = pack;
    pack += RoundUpFloats(a.seq_kv * L);
    t.data = rows;
    t.dtype = DType::kF32;
    t.sb = t.sh = 0;
    t.ss = L;
    return rows;
  };
  float* const k_rows = use(packed->k);
  float* const v_rows = use(packed->v);
  if (memcmp(tag_at, tag, sizeof(tag)) != 0) {
    if (k_rows) PackHeadRows(views.k, views.pages, b, g, a.seq_kv, L, k_rows);
    if (v_rows) PackHeadRows(views.v, views.pages, b, g, a.seq_kv, L, v_rows);
    memcpy(tag_at, tag, sizeof(tag));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_HEAD_PACK_INL_H_
