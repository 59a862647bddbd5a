// What every attention path shares: the tile sizes, the per-thread scratch
// and its layout, the K/V row readers (in place, or 16-bit widened tile by
// tile), the software prefetch helpers, and the end of a block (FinishRows).
//
// attention: O_h = softmax(scale Q_h K_g^T + mask) V_g without materializing
// the scores: flash-style online softmax over tiles of keys.  Per query row
// the running max m, running denominator l and unnormalized output acc obey,
// for each key tile T:
//   m' = max(m, max_{j in T} s_j)
//   acc = acc * exp(m - m') + sum_{j in T} exp(s_j - m') V_j
//   l   = l   * exp(m - m') + sum_{j in T} exp(s_j - m')
// and O = acc / l at the end (zeros when the row sees no key; NaN when it
// sees a NaN or +inf score, as IEEE arithmetic on the reference gives).
// The kernels carry the scores in base 2, s log2(e) (the factor folded into
// the scale), so that each exponential is a 2^x: exp(s - m) = 2^(s2 - m2).
//
// Each path (one -inl.h in this folder) computes a block of query rows
// [i0, i1) of one head over a range of keys; dispatch/attention_paths.cc
// picks the path for each block from one table.

#if defined(HEADSUM_KERNELS_ATTENTION_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_COMMON_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_COMMON_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_COMMON_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "hwy/cache_control.h"
#include "kernels/convert-inl.h"
#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// Keys per tile: the S^T tile (128 x 64 floats = 32 KiB) and the value rows
// it weighs stay in L1/L2 while both products run over them.
constexpr size_t kKeyTile = 128;
constexpr size_t kQueryBlock = kAttentionQueryBlock;
// Up to this many query rows, each row runs alone on dot products: a block
// of vectors along the queries would be mostly padding.
constexpr size_t kDotRows = kAttentionDotRows;
// Keys per tile of the dot path: the scores of a tile (2 KiB) stay in L1
// while its value rows stream once through registers.
constexpr size_t kDotKeyTile = 512;
// Blocks of up to this many rows (decode, grouped decode) copy misaligned
// f32 Q rows into aligned scratch (QCopied).
constexpr size_t kCopiedQRows = 16;

// Query columns of the transposed tiles: the block rounded up to vectors.
inline size_t QueryColumns(size_t rows) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  return RoundUpToVectors(rows, N);
}

struct FlashScratch {
  size_t ldw;     // row stride of q_t and s_t: QueryColumns(kQueryBlock)
  float* q_t;     // [L][ldw]        scale * Q^T of the block, zero-padded
  float* s_t;     // [kKeyTile][ldw] S^T, then P^T
  float* acc;     // [kQueryBlock][L]
  float* m;       // [ldw] running max
  float* l;       // [ldw] running denominator
  float* corr;    // [ldw] 2^(m - m') of the last tile
  float* bad;     // [ldw] nonzero once a NaN or +inf score was seen
  float* s_row;   // [kDotKeyTile] the dot path's scores
  float* k_t;     // [L][kKeyTile] scale log2(e) K^T of a tile (keys-in-lanes path)
  float* q_rows;  // [kQueryBlock][L] 16-bit Q rows widened, or misaligned f32
                  // decode rows copied (QCopied)
  float* k_rows;  // [kKeyTile][L] 16-bit K rows of a tile widened (block paths)
  float* v_rows;  // [kKeyTile][L] 16-bit V rows of a tile widened (block paths)
  // Only where the call adds to its scores (AttnOptions::Scores), else null:
  float* slope_t; // [ldw] the block's rows' ALiBi slopes (base 2), per lane
  float* pos_t;   // [ldw] the block's rows' positions, per lane
  float* bias_t;  // [kKeyTile][ldw] a tile of the bias, transposed (base 2)
  float* bias_rows;  // [kQueryBlock][kKeyTile] 16-bit bias rows widened
};

// Whether the few f32 Q rows of a decode block at `row0`, `ld` floats apart,
// are copied into aligned scratch before the dot paths read them: when they
// are not vector-aligned.  Those paths load each Q vector once per key (or
// key pair); a Q 16 bytes off a 64-byte boundary split every such load
// across two cache lines, and a grouped decode step lost 15-25% to it.
inline bool QCopied(const char* row0, size_t ld) {
  const size_t align = hn::Lanes(hn::ScalableTag<float>()) * sizeof(float);
  return reinterpret_cast<uintptr_t>(row0) % align != 0 || (ld * sizeof(float)) % align != 0;
}

// K or V rows the block paths copy into scratch tile by tile: 16-bit ones
// (widened) where a head has one query block (with several, each thread
// widens a head's rows once: PackHeadViews).  Strided f32
// rows (token-major, a fused QKV buffer) are not copied per tile (measured:
// 12% of a token-major S=2048 prefill in memmove, as slow as reading in
// place without prefetch): a prefill of several query blocks copies them
// once per kv head (PackHeadViews), and the rest read them in
// place, the next tile prefetched (KvRows::PrefetchTile).
// Paged rows are gathered into scratch tile by tile (block paths) whatever
// their dtype.
inline bool CopiesKvTile(const TensorView& t, bool paged) { return paged || !t.IsF32(); }
inline size_t KvTileFloats(const TensorView& t, bool paged, size_t rows, size_t L) {
  return CopiesKvTile(t, paged) ? rows * L : 0;
}
// Rows of a widened K or V tile: a dot-path tile when K and V differ in
// dtype (RowByDot), else a key tile of the block paths (the dot paths read
// 16-bit rows of one dtype in place).  Whatever the shape: the path table
// may run any path on any block (the tests force each one).
inline size_t WidenedKvRows(const AttnViews& v) {
  return v.k.dtype != v.v.dtype ? kDotKeyTile : kKeyTile;
}

inline bool AddsToScores(const AttnDims& a) { return a.opt != nullptr && a.opt->Scores(); }
inline size_t ScoreExtrasFloats(const AttnDims& a) {
  const size_t ldw = QueryColumns(kQueryBlock);
  return AddsToScores(a) ? 2 * ldw + kKeyTile * ldw + kQueryBlock * kKeyTile : 0;
}

inline size_t AttentionScratch(const AttnDims& a, const AttnViews& v) {
  const size_t ldw = QueryColumns(kQueryBlock), L = a.head_dim;
  return ldw * L + kKeyTile * ldw + kQueryBlock * L + 4 * ldw + kDotKeyTile + L * kKeyTile +
         kQueryBlock * L + KvTileFloats(v.k, v.pages.table != nullptr, WidenedKvRows(v), L) +
         KvTileFloats(v.v, v.pages.table != nullptr, WidenedKvRows(v), L) + ScoreExtrasFloats(a);
}

inline FlashScratch CarveFlashScratch(const AttnDims& a, const AttnViews& v, float* scratch) {
  FlashScratch f;
  f.ldw = QueryColumns(kQueryBlock);
  f.q_t = scratch;
  f.s_t = f.q_t + f.ldw * a.head_dim;
  f.acc = f.s_t + kKeyTile * f.ldw;
  f.m = f.acc + kQueryBlock * a.head_dim;
  f.l = f.m + f.ldw;
  f.corr = f.l + f.ldw;
  f.bad = f.corr + f.ldw;
  f.s_row = f.bad + f.ldw;
  f.k_t = f.s_row + kDotKeyTile;
  f.q_rows = f.k_t + a.head_dim * kKeyTile;
  f.k_rows = f.q_rows + kQueryBlock * a.head_dim;
  const bool paged = v.pages.table != nullptr;
  f.v_rows = f.k_rows + KvTileFloats(v.k, paged, WidenedKvRows(v), a.head_dim);
  f.slope_t = f.pos_t = f.bias_t = f.bias_rows = nullptr;
  if (AddsToScores(a)) {
    f.slope_t = f.v_rows + KvTileFloats(v.v, paged, WidenedKvRows(v), a.head_dim);
    f.pos_t = f.slope_t + f.ldw;
    f.bias_t = f.pos_t + f.ldw;
    f.bias_rows = f.bias_t + kKeyTile * f.ldw;
  }
  return f;
}

// Prefetches the cache lines of `bytes` bytes from p, the last one too
// where p is not at a line's start (as the matmul and projection prefetches
// do). GCC 12 deletes a loop made only of
// prefetches (and the calls to a function made of one): the empty asm that
// takes each address is an effect it must keep.
// kIntoL2: into L2 only (PrefetchIntoL2), else into L1 too.
template <bool kIntoL2 = false>
HWY_INLINE void PrefetchBytes(const void* p, size_t bytes) {
  if (bytes == 0) return;
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) {
    if constexpr (kIntoL2) {
      PrefetchIntoL2(c + i);
    } else {
      hwy::Prefetch(c + i);
    }
    asm volatile("" : : "r"(c + i));
  }
  // The same line again where p is line-aligned.
  if constexpr (kIntoL2) {
    PrefetchIntoL2(c + bytes - 1);
  } else {
    hwy::Prefetch(c + bytes - 1);
  }
}

// The decode kernels' prefetches of K and V rows (from DRAM): f32 rows
// into L2, 16-bit rows into L1 (except V rows read a whole tile later, which
// go into L2 whatever their dtype: PrefetchGroup8).  On the Zen 4 VM (H=32 L=128 Skv=32768,
// medians of 3, three alternated rounds, every attention prefetch into L2
// against into L1): f32 K/V one thread MHA 70.7-76.8 -> 54.6-60.9 ms, GQA
// (Hkv=8) 25.8-30.1 -> 19.1-20.2, two threads MHA 43.0-47.5 -> 38.0-40.3,
// GQA 14.0-16.0 -> 11.2-12.9; 16-bit K/V no faster (bf16 GQA one thread
// 9.8-11.2 -> 11.1-12.7 ms, f16 9.8-11.0 -> 11.4-12.1, bf16 MHA 28.6-35.8
// -> 34.1-35.5).
template <class T>
HWY_INLINE void PrefetchKvRow(const T* p, size_t bytes) {
  PrefetchBytes<sizeof(T) == 4>(p, bytes);
}

// Rows of K or V of one kv head as the kernels read them: f32 in place
// (row stride = the view's token stride), or 16-bit rows widened tile by
// tile into scratch (row stride L).
struct KvRows {
  const char* base;  // byte address of row 0
  DType dtype;
  size_t stride;     // elements between rows
  float* widened;    // scratch for a tile's rows (CopiesKvTile)
  // A paged cache (KvPages): row j in block pages[j / page_rows], base the
  // address of block 0's slot 0; null: rows `stride` apart from base.
  const int32_t* pages = nullptr;
  size_t page_rows = 0;
  size_t page_bytes = 0;  // between blocks

  const char* RowPtr(size_t j) const {
    const size_t bytes = DTypeBytes(dtype);
    if (pages == nullptr) return base + j * stride * bytes;
    return base + static_cast<size_t>(pages[j / page_rows]) * page_bytes +
           (j % page_rows) * stride * bytes;
  }
  // The first key past j's run of rows `stride` apart, at most `limit`: its
  // block's end, or further where the next blocks follow it in memory (the
  // table's next entries consecutive in a pool without gaps between blocks,
  // as an allocator hands out a prompt's blocks), read only below limit.
  size_t RunEnd(size_t j, size_t limit) const {
    if (pages == nullptr) return limit;
    size_t n = j / page_rows, end = (n + 1) * page_rows;
    if (page_bytes == page_rows * stride * DTypeBytes(dtype)) {
      while (end < limit && pages[n + 1] == pages[n] + 1) {
        ++n;
        end += page_rows;
      }
    }
    return HWY_MIN(end, limit);
  }
  // These rows over j's run as unpaged rows: row j' of the run at
  // base' + j' * stride (base' = RowPtr(j) - j * stride elements, an address
  // only ever offset back into the run).
  KvRows Run(size_t j) const {
    KvRows r = *this;
    r.pages = nullptr;
    r.base = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(RowPtr(j)) -
                                           j * stride * DTypeBytes(dtype));
    return r;
  }

  // Rows [j0, j0 + n) as f32; *ld receives their row stride in floats.
  // Contiguous f32 rows in place; 16-bit or strided rows copied (widened)
  // into scratch, contiguous.
  // Prefetches rows [j0, j0 + n): a tile's rows that are not contiguous
  // (token-major: 2 rows per 4 KiB page) do not start the hardware's stream
  // prefetcher, so the next tile is asked for while this one is computed.
  void PrefetchTile(size_t j0, size_t n, size_t L) const {
    if (stride == L && pages == nullptr) return;  // contiguous: the hardware streams it
    const size_t row_bytes = L * DTypeBytes(dtype);
    for (size_t r = 0; r < n; ++r) PrefetchBytes(RowPtr(j0 + r), row_bytes);
  }

  const float* Tile(size_t j0, size_t n, size_t L, size_t* ld) const {
    if (pages != nullptr && (dtype != DType::kF32 || RunEnd(j0, j0 + n) < j0 + n)) {
      // Gathered from the tile's blocks, widened (f32 rows of a tile inside
      // one block are read in place, below).
      for (size_t j = j0; j < j0 + n;) {
        const size_t stop = RunEnd(j, j0 + n);
        WidenRows(RowPtr(j), dtype, stride, stop - j, L, widened + (j - j0) * L, L);
        j = stop;
      }
      *ld = L;
      return widened;
    }
    if (dtype == DType::kF32) {
      *ld = stride;
      return reinterpret_cast<const float*>(RowPtr(j0));
    }
    WidenRows(base + j0 * stride * DTypeBytes(dtype), dtype, stride, n, L, widened, L);
    *ld = L;
    return widened;
  }
};

// f(k_run, v_run, j0, j1) over the runs of keys [begin, end) that lie
// `stride` apart (one run unless paged: then each block's part), k_run and
// v_run unpaged rows valid over the run; the first rows of the next run are
// prefetched before each (the hardware prefetchers do not cross blocks).
template <class F>
HWY_INLINE void ForEachKeyRun(const KvRows& k, const KvRows& v, size_t begin, size_t end,
                              size_t L, const F& f) {
  if (k.pages == nullptr || begin >= end) {
    f(k, v, begin, end);
    return;
  }
  for (size_t j = begin; j < end;) {
    const size_t stop = k.RunEnd(j, end);
    if (stop < end) {  // (the whole next block, up to 16 rows, measured no faster)
      const size_t ahead = HWY_MIN(size_t{4}, end - stop);
      k.PrefetchTile(stop, ahead, L);
      v.PrefetchTile(stop, ahead, L);
    }
    f(k.Run(j), v.Run(j), j, stop);
    j = stop;
  }
}

// The block paths' prefetch of the key tile after this one (keys from j up
// to kKeyTile of them, below end) while this one is computed: strided rows do
// not start the hardware's stream prefetcher (KvRows::PrefetchTile).
inline void PrefetchNextTiles(const KvRows& k, const KvRows& v, size_t j, size_t end, size_t L) {
  if (j >= end) return;
  const size_t next = HWY_MIN(kKeyTile, end - j);
  k.PrefetchTile(j, next, L);
  v.PrefetchTile(j, next, L);
}

// Where FinishRows puts a block's final rows.
struct OutRows {
  char* base;  // byte address of row 0
  DType dtype;
  size_t stride;  // elements between rows
  char* Row(size_t r) const { return base + r * stride * DTypeBytes(dtype); }
};

// The scale of the base-2 scores: s2 = (scale log2(e)) q . k.
inline float Base2Scale(const AttnDims& a) { return a.scale * 1.44269504088896341f; }

// Per query row, what a range of keys leaves behind when the keys are split
// across work items: the unnormalized output, the max and the denominator.
inline size_t PartialFloats(const AttnDims& a) { return a.head_dim + 2; }

// The sink of a row (base 2) joins its denominator: with M = max(m, sink),
// acc and l scale by 2^(m - M) and l gains 2^(sink - M) (a row that saw no
// key: zeros, its mass all the sink's).  Returns the factor on acc / l.
inline float SinkFactor(float m, float l, float sink2) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float M = HWY_MAX(m, sink2);
  const float scale = m == kNegInf ? 0.0f : std::exp2(m - M);
  const float denom = l * scale + std::exp2(sink2 - M);
  return scale / denom;
}

// Final rows (O = acc / l) into out, or partial records (acc, m, l) when
// partial != nullptr.  bad rows are NaN (m = NaN in a partial record).
// sinks2: null, or row r's sink (base 2) at sinks2[r] (final rows only:
// partial records take their sinks when merged).
inline void FinishRows(size_t rows, size_t L, float* HWY_RESTRICT acc,
                       const float* HWY_RESTRICT m, const float* HWY_RESTRICT l,
                       const float* HWY_RESTRICT bad, const OutRows& out,
                       float* HWY_RESTRICT partial, const float* sinks2 = nullptr) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT acc_r = acc + r * L;
    if (partial != nullptr) {
      float* HWY_RESTRICT rec = partial + r * (L + 2);
      ForEachVector(L, [&](auto d, size_t c) { hn::StoreU(hn::LoadU(d, acc_r + c), d, rec + c); });
      rec[L] = bad[r] != 0.0f ? kNaN : m[r];
      rec[L + 1] = l[r];
      continue;
    }
    // l > 0: normal; bad: NaN; l = 0: the row saw no key, zeros.
    const float inv = bad[r] != 0.0f      ? kNaN
                      : sinks2 != nullptr ? SinkFactor(m[r], l[r], sinks2[r])
                      : (l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    if (out.dtype == DType::kF32) {
      float* HWY_RESTRICT o_r = reinterpret_cast<float*>(out.Row(r));
      ForEachVector(L, [&](auto d, size_t c) {
        hn::StoreU(hn::Mul(hn::LoadU(d, acc_r + c), hn::Set(d, inv)), d, o_r + c);
      });
    } else {  // 16-bit: the f32 row, rounded once
      ScaleRow(acc_r, L, inv);
      StoreRow(acc_r, L, out.Row(r), out.dtype);
    }
  }
}

// A block of query rows [i0, i1) of head (b, h) as every path starts it:
// Q rows in place (f32) or widened (16-bit; misaligned f32 rows of a small
// block copied: QCopied), K and V of the kv head as KvRows, the output rows,
// and the running max, denominator and NaN flags initialized.
struct Block {
  FlashScratch f;
  const float* HWY_RESTRICT q;
  size_t ldq;
  KvRows k, v;
  OutRows out;
  size_t rows;
  size_t b, h, i0;
};

inline Block StartBlock(const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                        size_t i0, size_t i1, float* HWY_RESTRICT scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, rows = i1 - i0, g = h / a.group();
  const FlashScratch f = CarveFlashScratch(a, views, scratch);
  const TensorView& vq = views.q;
  const float* HWY_RESTRICT q;
  size_t ldq;
  if (vq.IsF32() && !(rows <= kCopiedQRows && QCopied(vq.Row(b, h, i0), vq.ss))) {
    q = reinterpret_cast<const float*>(vq.Row(b, h, i0));
    ldq = vq.ss;
  } else {
    WidenRows(vq.Row(b, h, i0), vq.dtype, vq.ss, rows, L, f.q_rows, L);
    q = f.q_rows;
    ldq = L;
  }
  const size_t cols = QueryColumns(rows);
  Fill(f.m, cols, kNegInf);
  Fill(f.l, cols, 0.0f);
  Fill(f.bad, cols, 0.0f);
  return Block{f,
               q,
               ldq,
               KvRows{views.k.Row(b, g, 0), views.k.dtype, views.k.ss, f.k_rows,
                      views.pages.table, views.pages.rows,
                      views.pages.stride * DTypeBytes(views.k.dtype)},
               KvRows{views.v.Row(b, g, 0), views.v.dtype, views.v.ss, f.v_rows,
                      views.pages.table, views.pages.rows,
                      views.pages.stride * DTypeBytes(views.v.dtype)},
               OutRows{views.out.Row(b, h, i0), views.out.dtype, views.out.ss},
               rows,
               b,
               h,
               i0};
}

constexpr float kLog2e = 1.44269504088896341f;

// The block's rows, final (partial == nullptr) or as partial records.
inline void EndBlock(const AttnDims& a, const Block& blk, float* HWY_RESTRICT partial) {
  float sinks2[kQueryBlock];
  const bool sinks = partial == nullptr && a.opt != nullptr && a.opt->sinks != nullptr;
  for (size_t r = 0; sinks && r < blk.rows; ++r) {
    sinks2[r] = kLog2e * a.opt->sinks[a.query_head(blk.h, blk.i0 + r)];
  }
  FinishRows(blk.rows, a.head_dim, blk.f.acc, blk.f.m, blk.f.l, blk.f.bad, blk.out, partial,
             sinks ? sinks2 : nullptr);
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = 2^(-2 log2(e) |x|) in (0, 1]: one
// exponential of a non-positive argument.  Absolute error within a few
// float epsilons (tests/error_bounds.cc: the softcap term).  NaN stays NaN;
// +-inf gives +-1.
template <class D, class V>
HWY_INLINE V TanhByExp2(D d, V x) {
  const V e = Exp2NonPositive(d, hn::Mul(hn::Abs(x), hn::Set(d, -2.0f * kLog2e)));
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Div(hn::Sub(one, e), hn::Add(one, e));
  return hn::CopySign(t, x);
}

// 1 / cap2, at most FLT_MAX: a subnormal softcap (finite, so valid) has an
// inverse beyond f32, and 0 * inf would make a zero score NaN where the
// capped score is 0 (the fuzz harness found it); x * FLT_MAX still takes
// tanh to +-1 for any other score.
inline float CapInverse(float cap2) {
  const float inv = 1.0f / cap2;
  return inv < std::numeric_limits<float>::max() ? inv : std::numeric_limits<float>::max();
}

// What one query row adds to its scores (softcap, ALiBi, bias), the scores
// in base 2 (s log2(e)): cap2 = softcap log2(e), slope2 = slope log2(e).
struct RowExtras {
  float cap2 = 0.0f;
  float slope2 = 0.0f;
  float pos = 0.0f;           // the row's position
  const char* bias = nullptr; // the row's bias at key 0, or null
  DType bias_dtype = DType::kF32;
};

inline RowExtras ExtrasOf(const AttnDims& a, size_t b, size_t h, size_t i) {
  RowExtras x;
  const AttnOptions& o = *a.opt;
  x.cap2 = o.softcap * kLog2e;
  if (o.slopes != nullptr) x.slope2 = o.slopes[a.query_head(h, i)] * kLog2e;
  x.pos = static_cast<float>(a.position(i));
  if (o.has_bias) {
    x.bias = o.bias.Row(b, h, i);
    x.bias_dtype = o.bias.dtype;
  }
  return x;
}

// s[j] for keys j0 + j, j < n, of one row: the scores with the row's
// extras applied, in the API's order (softcap, then ALiBi, then bias).
inline void AddRowExtras(const RowExtras& x, size_t j0, size_t n, float* HWY_RESTRICT s) {
  if (x.cap2 > 0.0f) {
    const float inv = CapInverse(x.cap2);
    ForEachVector(n, [&](auto d, size_t j) {
      const auto t = TanhByExp2(d, hn::Mul(hn::LoadU(d, s + j), hn::Set(d, inv)));
      hn::StoreU(hn::Mul(t, hn::Set(d, x.cap2)), d, s + j);
    });
  }
  if (x.slope2 != 0.0f) {
    // slope (j - p): j - p exact in f32 (|j|, |p| < 2^24).
    ForEachVector(n, [&](auto d, size_t j) {
      const hn::RebindToSigned<decltype(d)> di;
      const auto key = hn::ConvertTo(d, hn::Iota(di, static_cast<int32_t>(j0 + j)));
      const auto dist = hn::Sub(key, hn::Set(d, x.pos));
      hn::StoreU(hn::MulAdd(hn::Set(d, x.slope2), dist, hn::LoadU(d, s + j)), d, s + j);
    });
  }
  if (x.bias != nullptr) {
    WithElementType(x.bias_dtype, x.bias, [&](const auto* bias) {
      const auto* HWY_RESTRICT row = bias + j0;
      ForEachVector(n, [&](auto d, size_t j) {
        hn::StoreU(hn::MulAdd(LoadF32(d, row + j), hn::Set(d, kLog2e), hn::LoadU(d, s + j)), d,
                   s + j);
      });
    });
  }
}

// The block paths' S^T tile (s_t[j][r], keys j0 + j, j < nj, rows r <
// rows, rows along the lanes, cols = whole vectors of them): the rows'
// extras applied.  The per-lane slopes and positions are in f.slope_t and
// f.pos_t (BlockExtrasSetUp); a bias tile is transposed into f.bias_t.
inline void BlockExtrasSetUp(const AttnDims& a, const Block& blk) {
  const FlashScratch& f = blk.f;
  const size_t cols = QueryColumns(blk.rows);
  for (size_t r = 0; r < cols; ++r) {
    const bool row = r < blk.rows;
    f.slope_t[r] = row && a.opt->slopes != nullptr
                       ? a.opt->slopes[a.query_head(blk.h, blk.i0 + r)] * kLog2e
                       : 0.0f;
    f.pos_t[r] = row ? static_cast<float>(a.position(blk.i0 + r)) : 0.0f;
  }
}

inline void AddTileExtras(const AttnDims& a, const Block& blk, size_t j0, size_t nj,
                          float* HWY_RESTRICT s_t, size_t ldw) {
  const AttnOptions& o = *a.opt;
  const FlashScratch& f = blk.f;
  const size_t cols = QueryColumns(blk.rows);
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  if (o.softcap > 0.0f) {
    const auto cap2 = hn::Set(d, o.softcap * kLog2e), inv = hn::Set(d, CapInverse(o.softcap * kLog2e));
    for (size_t j = 0; j < nj; ++j) {
      for (size_t c = 0; c < cols; c += N) {
        float* HWY_RESTRICT p = s_t + j * ldw + c;
        hn::StoreU(hn::Mul(TanhByExp2(d, hn::Mul(hn::LoadU(d, p), inv)), cap2), d, p);
      }
    }
  }
  if (o.slopes != nullptr) {
    for (size_t j = 0; j < nj; ++j) {
      const auto key = hn::Set(d, static_cast<float>(j0 + j));
      for (size_t c = 0; c < cols; c += N) {
        float* HWY_RESTRICT p = s_t + j * ldw + c;
        const auto dist = hn::Sub(key, hn::LoadU(d, f.pos_t + c));
        hn::StoreU(hn::MulAdd(hn::LoadU(d, f.slope_t + c), dist, hn::LoadU(d, p)), d, p);
      }
    }
  }
  if (o.has_bias) {
    // The rows' bias rows are one stride apart: the query rows' (ss), or
    // the heads' where the rows are heads (GroupDecodeHeads regroups it).
    const size_t rows = blk.rows;
    const char* row0 = o.bias.Row(blk.b, blk.h, blk.i0);
    const size_t ld = o.bias.ss;
    if (ld == 0 || rows == 1) {  // one row for all: broadcast along the lanes
      WithElementType(o.bias.dtype, row0, [&](const auto* bias) {
        const hn::CappedTag<float, 1> d1;
        for (size_t j = 0; j < nj; ++j) {
          const auto add = hn::Set(d, kLog2e * hn::GetLane(LoadF32(d1, bias + j0 + j)));
          for (size_t c = 0; c < cols; c += N) {
            float* HWY_RESTRICT p = s_t + j * ldw + c;
            hn::StoreU(hn::Add(hn::LoadU(d, p), add), d, p);
          }
        }
      });
      return;
    }
    const float* src;
    size_t lds;
    if (o.bias.IsF32()) {
      src = reinterpret_cast<const float*>(row0) + j0;
      lds = ld;
    } else {
      WidenRows(row0 + j0 * DTypeBytes(o.bias.dtype), o.bias.dtype, ld, rows, nj, f.bias_rows,
                kKeyTile);
      src = f.bias_rows;
      lds = kKeyTile;
    }
    TransposeScaledPadded(src, rows, nj, lds, kLog2e, f.bias_t, ldw, cols);
    for (size_t j = 0; j < nj; ++j) {
      for (size_t c = 0; c < cols; c += N) {
        float* HWY_RESTRICT p = s_t + j * ldw + c;
        hn::StoreU(hn::Add(hn::LoadU(d, p), hn::LoadU(d, f.bias_t + j * ldw + c)), d, p);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_COMMON_INL_H_
