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
// A block of query rows computes the transposed scores S^T = K_T (scale Q)^T
// of each key tile: K is read in place as the broadcast operand (no K^T
// packing per tile), queries run along the vector lanes, so the max, the
// exponentials and the denominators of all rows are vector operations down
// the keys, and P V reads P^T with a column stride.  Up to 3 query rows (a
// decode step) use dot products instead, one row at a time; 4 to N/2 rows
// (grouped heads of a decode step, short prefills) run with the keys along
// the lanes (FlashAttentionRowsByKeys).

#if defined(HEADSUM_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_INL_H_
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
constexpr size_t kDotRows = 3;
// Keys per tile of the dot path: the scores of a tile (2 KiB) stay in L1
// while its value rows stream once through registers.
constexpr size_t kDotKeyTile = 512;

// Query columns of the transposed tiles: the block rounded up to vectors.
inline size_t QueryColumns(size_t rows) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  return RoundUpToVectors(rows, N);
}

// Whether a block of rows that all see the same keys runs on the grouped
// dot products although it is larger than 4 groups: on 16 or more lanes, a
// block up to a quarter vector past one vector (the seed's 20 rows on
// AVX-512) over few keys.  The transposed tiles would pad it to two vectors
// of query lanes (37% of the QK^T lanes and of the softmax's are padding at
// 20 rows), and over a few keys nothing amortizes the block's Q transpose.
// Measured on the Sapphire Rapids VM (B=1 H=8 L=64, Sq = Skv = S, one
// thread, 16-byte offset, paired rounds, time grouped / transposed): S=20
// 0.82 (q1-q3 0.82-0.84), S=24 0.97 (0.94-1.10), S=36 1.05, S=44 1.10.
inline bool GroupsShortBlock(size_t rows, size_t keys, size_t lanes) {
  return lanes >= 16 && rows <= lanes + lanes / 4 && keys <= 2 * lanes;
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
// widens a head's rows once: FlashAttentionRowsHeadPacked).  Strided f32
// rows (token-major, a fused QKV buffer) are not copied per tile (measured:
// 12% of a token-major S=2048 prefill in memmove, as slow as reading in
// place without prefetch): a prefill of several query blocks copies them
// once per kv head (FlashAttentionRowsHeadPacked), and the rest read them in
// place, the next tile prefetched (KvRows::PrefetchTile).
inline bool CopiesKvTile(const TensorView& t, size_t /*L*/) { return !t.IsF32(); }
inline size_t KvTileFloats(const TensorView& t, size_t rows, size_t L) {
  return CopiesKvTile(t, L) ? rows * L : 0;
}
// Rows of a widened K or V tile: a dot-path tile when K and V differ in
// dtype (RowByDot), else none when every block runs on the dot path (which
// reads 16-bit rows in place), else a key tile of the block paths.
inline size_t WidenedKvRows(const AttnDims& a, const AttnViews& v) {
  if (v.k.dtype != v.v.dtype) return kDotKeyTile;
  return a.seq_q <= kDotRows ? 0 : kKeyTile;
}

inline size_t AttentionScratch(const AttnDims& a, const AttnViews& v) {
  const size_t ldw = QueryColumns(kQueryBlock), L = a.head_dim;
  return ldw * L + kKeyTile * ldw + kQueryBlock * L + 4 * ldw + kDotKeyTile + L * kKeyTile +
         kQueryBlock * L + KvTileFloats(v.k, WidenedKvRows(a, v), L) +
         KvTileFloats(v.v, WidenedKvRows(a, v), L);
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
  f.v_rows = f.k_rows + KvTileFloats(v.k, WidenedKvRows(a, v), a.head_dim);
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
// -> 34.1-35.5; bench/results/2026-12-05-zen4-session23.md).
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

  // Rows [j0, j0 + n) as f32; *ld receives their row stride in floats.
  // Contiguous f32 rows in place; 16-bit or strided rows copied (widened)
  // into scratch, contiguous.
  // Prefetches rows [j0, j0 + n): a tile's rows that are not contiguous
  // (token-major: 2 rows per 4 KiB page) do not start the hardware's stream
  // prefetcher, so the next tile is asked for while this one is computed.
  void PrefetchTile(size_t j0, size_t n, size_t L) const {
    if (stride == L) return;  // contiguous: the hardware streams it
    const size_t row_bytes = L * DTypeBytes(dtype), bytes = stride * DTypeBytes(dtype);
    for (size_t r = 0; r < n; ++r) PrefetchBytes(base + (j0 + r) * bytes, row_bytes);
  }

  const float* Tile(size_t j0, size_t n, size_t L, size_t* ld) const {
    if (dtype == DType::kF32) {
      *ld = stride;
      return reinterpret_cast<const float*>(base) + j0 * stride;
    }
    WidenRows(base + j0 * stride * DTypeBytes(dtype), dtype, stride, n, L, widened, L);
    *ld = L;
    return widened;
  }
};

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

// Final rows (O = acc / l) into out, or partial records (acc, m, l) when
// partial != nullptr.  bad rows are NaN (m = NaN in a partial record).
inline void FinishRows(size_t rows, size_t L, float* HWY_RESTRICT acc,
                       const float* HWY_RESTRICT m, const float* HWY_RESTRICT l,
                       const float* HWY_RESTRICT bad, const OutRows& out,
                       float* HWY_RESTRICT partial) {
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
    const float inv = bad[r] != 0.0f ? kNaN : (l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
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

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// RescaleAddWeightedRows' columns [0, kV * N) of v and acc in one pass over
// the n rows: kV accumulators, one FMA chain each over the keys in order.
// The two chains a vector (even and odd keys) of the general loop below fit
// 16 registers only four vectors at a time, so at L = 64 it read each V row
// in two passes of half a row; one pass in row order, the chains' latency
// covered by the eight vectors' independent FMAs: an MHA decode step (H=8,
// L=64, one thread, Zen 3 VM) with K/V of 1-4 MiB (L2/L3) 11.2-11.5 ->
// 9.9-10.0 ns a key and head (with RowScores4Q: see there).
template <size_t kV, class D, class TV>
HWY_INLINE void PvPass(D d, const float* HWY_RESTRICT p, size_t n, const TV* HWY_RESTRICT v,
                       size_t ldv, hn::Vec<D> vcorr, float* HWY_RESTRICT acc) {
  const size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t j = 0; j < n; ++j, v += ldv) {
    const auto pj = hn::Set(d, p[j]);
    a0 = hn::MulAdd(pj, LoadF32(d, v), a0);
    if constexpr (kV > 1) a1 = hn::MulAdd(pj, LoadF32(d, v + N), a1);
    if constexpr (kV > 2) a2 = hn::MulAdd(pj, LoadF32(d, v + 2 * N), a2);
    if constexpr (kV > 3) a3 = hn::MulAdd(pj, LoadF32(d, v + 3 * N), a3);
    if constexpr (kV > 4) a4 = hn::MulAdd(pj, LoadF32(d, v + 4 * N), a4);
    if constexpr (kV > 5) a5 = hn::MulAdd(pj, LoadF32(d, v + 5 * N), a5);
    if constexpr (kV > 6) a6 = hn::MulAdd(pj, LoadF32(d, v + 6 * N), a6);
    if constexpr (kV > 7) a7 = hn::MulAdd(pj, LoadF32(d, v + 7 * N), a7);
  }
  const auto out = [&](size_t i, auto a) {
    hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i * N), vcorr, a), d, acc + i * N);
  };
  out(0, a0);
  if constexpr (kV > 1) out(1, a1);
  if constexpr (kV > 2) out(2, a2);
  if constexpr (kV > 3) out(3, a3);
  if constexpr (kV > 4) out(4, a4);
  if constexpr (kV > 5) out(5, a5);
  if constexpr (kV > 6) out(6, a6);
  if constexpr (kV > 7) out(7, a7);
}
#endif

// acc[:] = corr * acc[:] + sum_{j < n} p[j] V[j][:].  The sum over the keys
// stays in registers: per block of columns, two FMA chains per vector (even
// and odd keys), added at the end, so acc is read and written once per tile.
template <class TV>
HWY_INLINE void RescaleAddWeightedRows(const float* HWY_RESTRICT p, size_t n,
                                       const TV* HWY_RESTRICT v, size_t ldv, size_t L,
                                       float corr, float* HWY_RESTRICT acc) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vcorr = hn::Set(d, corr);
  size_t c = 0;
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  // 16 registers: the columns in passes of up to 8 vectors, one chain per
  // vector, each pass reading its columns of every row in order (L = 64:
  // one pass over each V row; see PvPass).
  for (; c + N <= L;) {
    const size_t vecs = HWY_MIN((L - c) / N, size_t{8});
    const auto pass = [&](auto width) {
      PvPass<decltype(width)::value>(d, p, n, v + c, ldv, vcorr, acc + c);
    };
    switch (vecs) {
      case 1: pass(std::integral_constant<size_t, 1>()); break;
      case 2: pass(std::integral_constant<size_t, 2>()); break;
      case 3: pass(std::integral_constant<size_t, 3>()); break;
      case 4: pass(std::integral_constant<size_t, 4>()); break;
      case 5: pass(std::integral_constant<size_t, 5>()); break;
      case 6: pass(std::integral_constant<size_t, 6>()); break;
      case 7: pass(std::integral_constant<size_t, 7>()); break;
      default: pass(std::integral_constant<size_t, 8>()); break;
    }
    c += vecs * N;
  }
#endif
  for (; c + 4 * N <= L; c += 4 * N) {
    auto e0 = hn::Zero(d), e1 = hn::Zero(d), e2 = hn::Zero(d), e3 = hn::Zero(d);
    auto o0 = hn::Zero(d), o1 = hn::Zero(d), o2 = hn::Zero(d), o3 = hn::Zero(d);
    const TV* HWY_RESTRICT v_c = v + c;
    size_t j = 0;
    for (; j + 2 <= n; j += 2, v_c += 2 * ldv) {
      const auto pe = hn::Set(d, p[j]), po = hn::Set(d, p[j + 1]);
      e0 = hn::MulAdd(pe, LoadF32(d, v_c), e0);
      e1 = hn::MulAdd(pe, LoadF32(d, v_c + N), e1);
      e2 = hn::MulAdd(pe, LoadF32(d, v_c + 2 * N), e2);
      e3 = hn::MulAdd(pe, LoadF32(d, v_c + 3 * N), e3);
      o0 = hn::MulAdd(po, LoadF32(d, v_c + ldv), o0);
      o1 = hn::MulAdd(po, LoadF32(d, v_c + ldv + N), o1);
      o2 = hn::MulAdd(po, LoadF32(d, v_c + ldv + 2 * N), o2);
      o3 = hn::MulAdd(po, LoadF32(d, v_c + ldv + 3 * N), o3);
    }
    if (j < n) {
      const auto pe = hn::Set(d, p[j]);
      e0 = hn::MulAdd(pe, LoadF32(d, v_c), e0);
      e1 = hn::MulAdd(pe, LoadF32(d, v_c + N), e1);
      e2 = hn::MulAdd(pe, LoadF32(d, v_c + 2 * N), e2);
      e3 = hn::MulAdd(pe, LoadF32(d, v_c + 3 * N), e3);
    }
    float* HWY_RESTRICT a_c = acc + c;
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a_c), vcorr, hn::Add(e0, o0)), d, a_c);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a_c + N), vcorr, hn::Add(e1, o1)), d, a_c + N);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a_c + 2 * N), vcorr, hn::Add(e2, o2)), d, a_c + 2 * N);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a_c + 3 * N), vcorr, hn::Add(e3, o3)), d, a_c + 3 * N);
  }
  // The rest, a vector (then a lane) at a time, four chains over the keys.
  const auto rest = [&](auto dc, size_t c) {
    auto s0 = hn::Zero(dc), s1 = hn::Zero(dc), s2 = hn::Zero(dc), s3 = hn::Zero(dc);
    const TV* HWY_RESTRICT v_c = v + c;
    size_t j = 0;
    for (; j + 4 <= n; j += 4, v_c += 4 * ldv) {
      s0 = hn::MulAdd(hn::Set(dc, p[j]), LoadF32(dc, v_c), s0);
      s1 = hn::MulAdd(hn::Set(dc, p[j + 1]), LoadF32(dc, v_c + ldv), s1);
      s2 = hn::MulAdd(hn::Set(dc, p[j + 2]), LoadF32(dc, v_c + 2 * ldv), s2);
      s3 = hn::MulAdd(hn::Set(dc, p[j + 3]), LoadF32(dc, v_c + 3 * ldv), s3);
    }
    for (; j < n; ++j, v_c += ldv) s0 = hn::MulAdd(hn::Set(dc, p[j]), LoadF32(dc, v_c), s0);
    const auto sum = hn::Add(hn::Add(s0, s1), hn::Add(s2, s3));
    hn::StoreU(hn::MulAdd(hn::LoadU(dc, acc + c), hn::Set(dc, corr), sum), dc, acc + c);
  };
  for (; c + N <= L; c += N) rest(d, c);
  const hn::CappedTag<float, 1> d1;
  for (; c < L; ++c) rest(d1, c);
}

// out[k] = the sum of the lanes of v_k, k = 0..7 (eight dot products'
// accumulators).  On x86 a transposing tree of horizontal adds reduces all
// eight at once (9 shuffles/adds on AVX2 instead of 8 full reductions of ~6
// each, which cost as much as the products in a grouped decode step); the
// sums are then per 128-bit block, added last.  Elsewhere: SumOfLanes each.
template <class D, class V>
HWY_INLINE void StoreSumsOfLanes8(D d, V v0, V v1, V v2, V v3, V v4, V v5, V v6, V v7,
                                  float* HWY_RESTRICT out) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
                     HWY_TARGET == HWY_AVX3_DL)
  if constexpr (hn::MaxLanes(d) >= 8) {
    __m256 w0, w1, w2, w3, w4, w5, w6, w7;
    if constexpr (hn::MaxLanes(d) == 16) {  // AVX3: add the 256-bit halves first
      const hn::Half<D> dh;
      const auto fold = [&](V v) { return hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)).raw; };
      w0 = fold(v0), w1 = fold(v1), w2 = fold(v2), w3 = fold(v3);
      w4 = fold(v4), w5 = fold(v5), w6 = fold(v6), w7 = fold(v7);
    } else {
      w0 = v0.raw, w1 = v1.raw, w2 = v2.raw, w3 = v3.raw;
      w4 = v4.raw, w5 = v5.raw, w6 = v6.raw, w7 = v7.raw;
    }
    // Per block: [s0 s1 s2 s3] of its four lanes of w0..w3, and of w4..w7.
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(w0, w1), _mm256_hadd_ps(w2, w3));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(w4, w5), _mm256_hadd_ps(w6, w7));
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                        _mm256_permute2f128_ps(a, b, 0x31)));
    return;
  }
#elif HWY_ARCH_X86 && (HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3)
  if constexpr (hn::MaxLanes(d) == 4) {
    _mm_storeu_ps(out, _mm_hadd_ps(_mm_hadd_ps(v0.raw, v1.raw), _mm_hadd_ps(v2.raw, v3.raw)));
    _mm_storeu_ps(out + 4,
                  _mm_hadd_ps(_mm_hadd_ps(v4.raw, v5.raw), _mm_hadd_ps(v6.raw, v7.raw)));
    return;
  }
#endif
  out[0] = hn::GetLane(hn::SumOfLanes(d, v0));
  out[1] = hn::GetLane(hn::SumOfLanes(d, v1));
  out[2] = hn::GetLane(hn::SumOfLanes(d, v2));
  out[3] = hn::GetLane(hn::SumOfLanes(d, v3));
  out[4] = hn::GetLane(hn::SumOfLanes(d, v4));
  out[5] = hn::GetLane(hn::SumOfLanes(d, v5));
  out[6] = hn::GetLane(hn::SumOfLanes(d, v6));
  out[7] = hn::GetLane(hn::SumOfLanes(d, v7));
}

// dst[t] = scale * src[t] for t < 8, src aligned: whole vectors (up to 8
// lanes).  Written element by element after StoreSumsOfLanes8, GCC kept the
// eight sums as scalars, extracting and reinserting each (about 10% of a
// grouped decode step on AVX-512).
HWY_INLINE void ScaleEight(const float* HWY_RESTRICT src, float scale, float* HWY_RESTRICT dst) {
  const hn::CappedTag<float, 8> d8;
  const size_t n = hn::Lanes(d8);
  for (size_t t = 0; t < 8; t += n) {
    hn::StoreU(hn::Mul(hn::Load(d8, src + t), hn::Set(d8, scale)), d8, dst + t);
  }
}

// Keys ahead of the one being read that the dot path prefetches: far enough
// to cover the memory latency at DRAM bandwidth, near enough to stay in L1.
constexpr size_t kPrefetchKeys = 8;

// Keys ahead whose K rows the eight-key dot path prefetches (K/V from DRAM):
// the next group of eight.  Measured on Zen 5 (H=32 L=128 Skv=32768, one
// thread, medians, variants alternated process by process): 8 against 16
// f32 K/V 36.8-40.6 vs 38.9-44.1 ms, f16 19.4-20.1 vs 20.7-23.1 ms, bf16
// 19.6-20.3 vs 20.3-21.9 ms; 4 alike; no K prefetch 26-29 ms (16-bit).
constexpr size_t kPrefetchKeys8 = 8;

// The prefetches of a group of eight keys of the dot path (K/V from DRAM):
// the K rows kPrefetchKeys8 keys ahead (of those left), the group's V rows.
// The V rows go into L2 whatever their dtype: P V reads them only after the
// whole tile's scores (kDotKeyTile keys, 128 KiB of 16-bit V at L = 128),
// far more than L1 holds, and into L1 (where PrefetchKvRow puts 16-bit
// rows) they only pushed out the K rows prefetched for the next groups.
// Measured on the Zen 4 VM (H=32 L=128 Skv=32768, medians of 5 calls, old
// and new library alternated, 4 rounds): two threads f16 22.9-27.3 ->
// 21.5-26.1 ms, bf16 25.4-28.4 -> 23.3-25.5 (faster in all 8 pairs); one
// thread alike (f16 31.7-46.5 vs 31.1-54.9, bf16 31.2-48.0 vs 30.9-35.8).
// (Also tried there: K rows into L2 too, or 4/16/32 keys ahead; next
// tile's K rows prefetched into L2 during P V; 1024/2048-key splits for
// 16-bit K/V: none better than this within the machine's noise.)
template <class TK, class TV>
HWY_INLINE void PrefetchGroup8(const TK* k0, size_t ldk, size_t k_bytes, const TV* v0,
                               size_t ldv, size_t v_bytes, size_t keys_left) {
  for (size_t t = 0; t < 8; ++t) {
    if (kPrefetchKeys8 + t < keys_left) PrefetchKvRow(k0 + (kPrefetchKeys8 + t) * ldk, k_bytes);
    PrefetchBytes</*kIntoL2=*/true>(v0 + t * ldv, v_bytes);
  }
}

// s8[t] = the sum of the lanes of dot(k0 + t * ldk), t < 8: eight dot
// products' accumulators, reduced together.
template <class D, class Dot, class TK>
HWY_INLINE void DotSums8(D d, const Dot& dot, const TK* k0, size_t ldk, float* HWY_RESTRICT s8) {
  const auto a0 = dot(k0);
  const auto a1 = dot(k0 + ldk);
  const auto a2 = dot(k0 + 2 * ldk);
  const auto a3 = dot(k0 + 3 * ldk);
  const auto a4 = dot(k0 + 4 * ldk);
  const auto a5 = dot(k0 + 5 * ldk);
  const auto a6 = dot(k0 + 6 * ldk);
  const auto a7 = dot(k0 + 7 * ldk);
  StoreSumsOfLanes8(d, a0, a1, a2, a3, a4, a5, a6, a7, s8);
}

// The loop over a tile's groups of eight keys that RowScores8Q and
// RowScores4Q share: prefetches (K/V from memory), sums8(k0, s8) for the
// eight dot products' vector columns [0, lv), the rest lane by lane, the
// scale.  Returns the keys done (a multiple of 8).
template <class TK, class TV, class Sums8>
HWY_INLINE size_t ScoreGroupsOf8(const float* HWY_RESTRICT q, const TK* HWY_RESTRICT k_tile,
                                 size_t ldk, size_t nj, size_t L, size_t lv, float scale2,
                                 float* HWY_RESTRICT s, const TV* HWY_RESTRICT v_tile, size_t ldv,
                                 size_t keys_left, bool prefetch, const Sums8& sums8) {
  const hn::CappedTag<float, 1> d1;
  size_t j = 0;
  for (; j + 8 <= nj; j += 8) {
    const TK* HWY_RESTRICT k0 = k_tile + j * ldk;
    if (prefetch) {  // K/V from DRAM: K rows kPrefetchKeys8 ahead, this group's V rows
      PrefetchGroup8(k0, ldk, L * sizeof(TK), v_tile + j * ldv, ldv, L * sizeof(TV),
                     keys_left - j);
    }
    HWY_ALIGN float s8[8];
    sums8(k0, s8);
    for (size_t c = lv; c < L; ++c) {
      for (size_t t = 0; t < 8; ++t) s8[t] += q[c] * hn::GetLane(LoadF32(d1, k0 + t * ldk + c));
    }
    ScaleEight(s8, scale2, s + j);
  }
  return j;
}

// s[j] = scale2 * q . K[j] for the first keys of a tile, eight at a time,
// their eight accumulators reduced together (StoreSumsOfLanes8), q's kQ
// vectors held in registers (kQ = 0: more than the registers hold, loaded
// per row).  The eight rows are read one after the other, in memory order
// (5-10% faster than column block by column block across the eight).  With
// `prefetch` (K/V read from DRAM: AttnDims::prefetch_kv) each group of eight
// prefetches the K rows kPrefetchKeys8 keys ahead and its own V rows, so
// that the K and V streams are in flight together.  Scored one key at a
// time, each dot product reduced on its own, a decode step spent about 40
// cycles a key on Zen 5 (95% of an MHA decode step in that loop); measured
// on that machine, medians of calls interleaved with the one-key loop (its
// prefetches spread key by key): an MHA decode step (H=8, L=64) over a
// 16.8 MB K/V 397 -> 285 us, over a 134 MB K/V (DRAM) 4.90 -> 4.62 ms, the
// layer's decode step over a 4096-token cache 499 -> 418 us on one thread,
// 207 -> 164 us on two.  Returns the keys done (a multiple of 8; the caller
// scores the rest); none on SCALAR.
template <size_t kQ, class TK, class TV>
HWY_INLINE size_t RowScores8Q(const float* HWY_RESTRICT q, const TK* HWY_RESTRICT k_tile,
                              size_t ldk, size_t nj, size_t L, float scale2,
                              float* HWY_RESTRICT s, const TV* HWY_RESTRICT v_tile, size_t ldv,
                              size_t keys_left, bool prefetch) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t lv = (kQ == 0 ? L / N : kQ) * N;  // columns in whole vectors; the rest lane by lane
  // (No arrays of vectors: SVE's are sizeless types.)
  using V = hn::Vec<decltype(d)>;
  // Only whole vectors of q are loaded (kQ = 0 covers L < N: no load past q).
  V q0 = hn::Zero(d), q1 = q0, q2 = q0, q3 = q0, q4 = q0, q5 = q0, q6 = q0, q7 = q0;
  if constexpr (kQ > 0) q0 = hn::LoadU(d, q);
  if constexpr (kQ > 1) q1 = hn::LoadU(d, q + N);
  if constexpr (kQ > 2) q2 = hn::LoadU(d, q + 2 * N);
  if constexpr (kQ > 3) q3 = hn::LoadU(d, q + 3 * N);
  if constexpr (kQ > 4) q4 = hn::LoadU(d, q + 4 * N);
  if constexpr (kQ > 5) q5 = hn::LoadU(d, q + 5 * N);
  if constexpr (kQ > 6) q6 = hn::LoadU(d, q + 6 * N);
  if constexpr (kQ > 7) q7 = hn::LoadU(d, q + 7 * N);
  const auto dot = [&](const TK* HWY_RESTRICT k_row) {
    if constexpr (kQ == 0) {
      auto acc = hn::Zero(d);
      for (size_t c = 0; c < lv; c += N) {
        acc = hn::MulAdd(hn::LoadU(d, q + c), LoadF32(d, k_row + c), acc);
      }
      return acc;
    }
    auto acc = hn::MulAdd(q0, LoadF32(d, k_row), hn::Zero(d));
    if constexpr (kQ > 1) acc = hn::MulAdd(q1, LoadF32(d, k_row + N), acc);
    if constexpr (kQ > 2) acc = hn::MulAdd(q2, LoadF32(d, k_row + 2 * N), acc);
    if constexpr (kQ > 3) acc = hn::MulAdd(q3, LoadF32(d, k_row + 3 * N), acc);
    if constexpr (kQ > 4) acc = hn::MulAdd(q4, LoadF32(d, k_row + 4 * N), acc);
    if constexpr (kQ > 5) acc = hn::MulAdd(q5, LoadF32(d, k_row + 5 * N), acc);
    if constexpr (kQ > 6) acc = hn::MulAdd(q6, LoadF32(d, k_row + 6 * N), acc);
    if constexpr (kQ > 7) acc = hn::MulAdd(q7, LoadF32(d, k_row + 7 * N), acc);
    return acc;
  };
  return ScoreGroupsOf8(q, k_tile, ldk, nj, L, lv, scale2, s, v_tile, ldv, keys_left, prefetch,
                        [&](const TK* HWY_RESTRICT k0, float* HWY_RESTRICT s8) {
                          DotSums8(d, dot, k0, ldk, s8);
                        });
}

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// out[k] = the sum of the lanes of v_k, k = 0..3, as StoreSumsOfLanes8 sums
// them (per 128-bit block, then the blocks): the same bits.
template <class V>
HWY_INLINE void StoreSumsOfLanes4(V v0, V v1, V v2, V v3, float* HWY_RESTRICT out) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0.raw, v1.raw), _mm256_hadd_ps(v2.raw, v3.raw));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
}

// RowScores8Q for AVX2 when q is 5 to 8 vectors (L = 40..64): q in
// registers and four rows at a time (4 accumulators beside q's kQ), each
// row read in order, its products one chain in column order: the chain and
// the sums of RowScores8Q<0>, which held the eight rows' accumulators and
// loaded q's vector beside each K vector (two loads per FMA and, for eight
// chains of kQ FMAs in program order, more than the reorder window keeps in
// flight: 49 instructions a key, and ~30 cycles a key with K in L2).
template <size_t kQ, class TK, class TV>
HWY_INLINE size_t RowScores4Q(const float* HWY_RESTRICT q, const TK* HWY_RESTRICT k_tile,
                              size_t ldk, size_t nj, size_t L, float scale2,
                              float* HWY_RESTRICT s, const TV* HWY_RESTRICT v_tile, size_t ldv,
                              size_t keys_left, bool prefetch) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto q0 = hn::LoadU(d, q), q1 = hn::LoadU(d, q + N), q2 = hn::LoadU(d, q + 2 * N);
  const auto q3 = hn::LoadU(d, q + 3 * N), q4 = hn::LoadU(d, q + 4 * N);
  auto q5 = q4, q6 = q4, q7 = q4;
  if constexpr (kQ > 5) q5 = hn::LoadU(d, q + 5 * N);
  if constexpr (kQ > 6) q6 = hn::LoadU(d, q + 6 * N);
  if constexpr (kQ > 7) q7 = hn::LoadU(d, q + 7 * N);
  const auto dot = [&](const TK* HWY_RESTRICT k_row) {
    auto acc = hn::MulAdd(q0, LoadF32(d, k_row), hn::Zero(d));
    acc = hn::MulAdd(q1, LoadF32(d, k_row + N), acc);
    acc = hn::MulAdd(q2, LoadF32(d, k_row + 2 * N), acc);
    acc = hn::MulAdd(q3, LoadF32(d, k_row + 3 * N), acc);
    acc = hn::MulAdd(q4, LoadF32(d, k_row + 4 * N), acc);
    if constexpr (kQ > 5) acc = hn::MulAdd(q5, LoadF32(d, k_row + 5 * N), acc);
    if constexpr (kQ > 6) acc = hn::MulAdd(q6, LoadF32(d, k_row + 6 * N), acc);
    if constexpr (kQ > 7) acc = hn::MulAdd(q7, LoadF32(d, k_row + 7 * N), acc);
    return acc;
  };
  return ScoreGroupsOf8(q, k_tile, ldk, nj, L, kQ * N, scale2, s, v_tile, ldv, keys_left,
                        prefetch, [&](const TK* HWY_RESTRICT k0, float* HWY_RESTRICT s8) {
    for (size_t h = 0; h < 8; h += 4) {
      const TK* HWY_RESTRICT kh = k0 + h * ldk;
      StoreSumsOfLanes4(dot(kh), dot(kh + ldk), dot(kh + 2 * ldk), dot(kh + 3 * ldk), s8 + h);
    }
  });
}
#endif

template <class TK, class TV>
HWY_INLINE size_t RowScores8(const float* HWY_RESTRICT q, const TK* HWY_RESTRICT k_tile,
                             size_t ldk, size_t nj, size_t L, float scale2,
                             float* HWY_RESTRICT s, const TV* HWY_RESTRICT v_tile, size_t ldv,
                             size_t keys_left, bool prefetch) {
#if HWY_TARGET != HWY_SCALAR
  // q's vectors in registers: up to 8 with 32 vector registers, 4 with 16
  // (x86 below AVX-512), beside the eight accumulators.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
  constexpr size_t kMaxQ = 4;
#else
  constexpr size_t kMaxQ = 8;
#endif
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  const auto run = [&](auto kq) {
    return RowScores8Q<decltype(kq)::value>(q, k_tile, ldk, nj, L, scale2, s, v_tile, ldv,
                                            keys_left, prefetch);
  };
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  const auto run4 = [&](auto kq) {
    return RowScores4Q<decltype(kq)::value>(q, k_tile, ldk, nj, L, scale2, s, v_tile, ldv,
                                            keys_left, prefetch);
  };
  switch (L / N) {
    case 5: return run4(std::integral_constant<size_t, 5>());
    case 6: return run4(std::integral_constant<size_t, 6>());
    case 7: return run4(std::integral_constant<size_t, 7>());
    case 8: return run4(std::integral_constant<size_t, 8>());
    default: break;
  }
#endif
  switch (L / N) {
    case 1: return run(std::integral_constant<size_t, 1>());
    case 2: return run(std::integral_constant<size_t, 2>());
    case 3: return run(std::integral_constant<size_t, 3>());
    case 4: return run(std::integral_constant<size_t, 4>());
    case 5: return run(std::integral_constant<size_t, kMaxQ >= 5 ? 5 : 0>());
    case 6: return run(std::integral_constant<size_t, kMaxQ >= 6 ? 6 : 0>());
    case 7: return run(std::integral_constant<size_t, kMaxQ >= 7 ? 7 : 0>());
    case 8: return run(std::integral_constant<size_t, kMaxQ >= 8 ? 8 : 0>());
    default: return run(std::integral_constant<size_t, 0>());
  }
#else
  (void)q, (void)k_tile, (void)ldk, (void)nj, (void)L, (void)scale2, (void)s;
  (void)v_tile, (void)ldv, (void)keys_left, (void)prefetch;
  return 0;
#endif
}

// The online softmax of one row's key tile (the dot paths): s_row's nj
// scores become their weights in place and m, l move on; *correction
// rescales the row's accumulator.  kBad: a NaN or +inf score (the row is
// NaN, *bad set); kSkip: nothing finite seen yet (nothing to add).
enum class TileStep { kUse, kSkip, kBad };
HWY_INLINE TileStep RowTileSoftmax(float* HWY_RESTRICT s_row, size_t nj, float* m, float* l,
                                   float* bad, float* correction) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float tile_max = RowMax(s_row, nj);
  if (!(tile_max < std::numeric_limits<float>::infinity())) {  // NaN or +inf
    *bad = 1.0f;
    return TileStep::kBad;
  }
  const float m_new = HWY_MAX(*m, tile_max);
  if (m_new == kNegInf) return TileStep::kSkip;
  *correction = *m == kNegInf ? 0.0f : std::exp2(*m - m_new);
  const float tile_sum = ExpShiftedRow</*kBase2=*/true>(s_row, nj, m_new, s_row);
  *l = *l * *correction + tile_sum;
  *m = m_new;
  return TileStep::kUse;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// f32 K and V rows that start off a 64-byte boundary, every row by the same
// amount (row strides a multiple of 16 floats: a buffer 16 bytes off, as
// std::vector gives): each 512-bit load of such a row spans two cache lines.
// Read instead in the rows' aligned frame: a row's floats [0, L) are lanes
// [sh, sh + L) of the kC aligned vectors that start sh floats before it; the
// first and the last vector are loaded masked (AVX-512's masked loads
// neither fault on nor return the lanes outside the row, which may hold
// anything: the tail of a KV cache, another buffer), the others aligned.
// The scores multiply them by a copy of q shifted by the same sh lanes
// (zeros around it); P V accumulates in V's frame, and the row's
// accumulator is shifted back once per call.  An MHA decode step (H=8,
// L=64, Skv=512, one thread, K/V in L2, Zen 5, runs alternated with aligned
// buffers) with buffers 16 bytes off: 29.1-31.9 -> 23.7-24.9 us (aligned
// 24.0-27.2).  Rebuilding each unaligned vector from two aligned ones with a
// permute instead (vpermt2ps, no frame) gained little (30.2 us): one
// permute per vector bound the loop.  Not used for grouped rows
// (GroupByDot): there four q rows share each load, the products bound the
// loop, and the frame's extra vector per row (5 for 4 at L=64) cost what the
// split loads had (measured alike).
constexpr size_t kMaxShiftedChunks = 9;  // L = 128 at a shift

struct ShiftedRows {
  const float* HWY_RESTRICT al;  // row 0's aligned frame: 64-byte aligned
  size_t shift;                  // lanes from al to row 0's first float
  size_t chunks;                 // aligned vectors per row
  size_t ld;                     // floats between rows, a multiple of 16

  ShiftedRows(const float* row0, size_t ld_, size_t L) : ld(ld_) {
    shift = (reinterpret_cast<uintptr_t>(row0) % 64) / sizeof(float);
    al = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(row0) - shift * sizeof(float));
    chunks = (shift + L + 15) / 16;
  }
};

// Whether f32 rows at row0, ld floats apart, can be read in their aligned
// frame: every row equally misaligned, and L = 64 or 128, where the frame
// gives every product and sum of the aligned path in the same order (the
// plain path's lane-by-lane and four-chain tails start only past a multiple
// of 64 columns): the results are bitwise those of aligned rows.
inline bool ShiftedFrameFits(const float* row0, size_t ld, size_t L) {
  return ld % 16 == 0 && reinterpret_cast<uintptr_t>(row0) % sizeof(float) == 0 &&
         (L == 64 || L == 128);
}

// Vector c of kC of a row in its aligned frame (first / last: the lanes of
// the row in the first and the last vector).
template <size_t c, size_t kC, class D, class M>
HWY_INLINE hn::Vec<D> ShiftedChunk(D d, const float* HWY_RESTRICT row_al, M first, M last) {
  if constexpr (kC == 1) return hn::MaskedLoad(hn::And(first, last), d, row_al);
  if constexpr (c == 0) return hn::MaskedLoad(first, d, row_al);
  if constexpr (c + 1 == kC) return hn::MaskedLoad(last, d, row_al + c * 16);
  return hn::Load(d, row_al + c * 16);
}

// s[j] = scale2 * q . K[j] for the first keys of a tile in K's aligned frame
// (qs: q shifted into it, kC aligned vectors), eight at a time as in
// RowScores8Q, with its prefetches; returns the keys done (a multiple of 8).
template <size_t kC, class M>
HWY_INLINE size_t RowScoresShifted(const float* HWY_RESTRICT qs, const float* HWY_RESTRICT k_al,
                                   size_t ldk, size_t nj, M first, M last, __m512i rotate,
                                   float scale2, float* HWY_RESTRICT s,
                                   const float* HWY_RESTRICT v_al, size_t ldv, size_t v_bytes,
                                   size_t keys_left, bool prefetch) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V q0 = hn::Load(d, qs), q1 = q0, q2 = q0, q3 = q0, q4 = q0, q5 = q0, q6 = q0, q7 = q0, q8 = q0;
  if constexpr (kC > 1) q1 = hn::Load(d, qs + 16);
  if constexpr (kC > 2) q2 = hn::Load(d, qs + 32);
  if constexpr (kC > 3) q3 = hn::Load(d, qs + 48);
  if constexpr (kC > 4) q4 = hn::Load(d, qs + 64);
  if constexpr (kC > 5) q5 = hn::Load(d, qs + 80);
  if constexpr (kC > 6) q6 = hn::Load(d, qs + 96);
  if constexpr (kC > 7) q7 = hn::Load(d, qs + 112);
  if constexpr (kC > 8) q8 = hn::Load(d, qs + 128);
  // Lane sh + i of the frame's sums holds lane i's of the aligned path's
  // (the same products, added in the same order): rotated back by sh lanes
  // before the reduction across lanes.
  const auto dot = [&](const float* HWY_RESTRICT r) {
    auto acc = hn::MulAdd(q0, ShiftedChunk<0, kC>(d, r, first, last), hn::Zero(d));
    if constexpr (kC > 1) acc = hn::MulAdd(q1, ShiftedChunk<1, kC>(d, r, first, last), acc);
    if constexpr (kC > 2) acc = hn::MulAdd(q2, ShiftedChunk<2, kC>(d, r, first, last), acc);
    if constexpr (kC > 3) acc = hn::MulAdd(q3, ShiftedChunk<3, kC>(d, r, first, last), acc);
    if constexpr (kC > 4) acc = hn::MulAdd(q4, ShiftedChunk<4, kC>(d, r, first, last), acc);
    if constexpr (kC > 5) acc = hn::MulAdd(q5, ShiftedChunk<5, kC>(d, r, first, last), acc);
    if constexpr (kC > 6) acc = hn::MulAdd(q6, ShiftedChunk<6, kC>(d, r, first, last), acc);
    if constexpr (kC > 7) acc = hn::MulAdd(q7, ShiftedChunk<7, kC>(d, r, first, last), acc);
    if constexpr (kC > 8) acc = hn::MulAdd(q8, ShiftedChunk<8, kC>(d, r, first, last), acc);
    return V{_mm512_permutexvar_ps(rotate, acc.raw)};
  };
  size_t j = 0;
  for (; j + 8 <= nj; j += 8) {
    const float* HWY_RESTRICT k0 = k_al + j * ldk;
    if (prefetch) PrefetchGroup8(k0, ldk, kC * 64, v_al + j * ldv, ldv, v_bytes, keys_left - j);
    HWY_ALIGN float s8[8];
    DotSums8(d, dot, k0, ldk, s8);
    ScaleEight(s8, scale2, s + j);
  }
  return j;
}

// acc_s = corr * acc_s + sum_{j < n} p[j] V[j] in V's aligned frame (kC
// aligned vectors), as RescaleAddWeightedRows: two chains per vector.
template <size_t kC, class M>
HWY_INLINE void RescaleAddShifted(const float* HWY_RESTRICT p, size_t n,
                                  const float* HWY_RESTRICT v_al, size_t ldv, M first, M last,
                                  float corr, float* HWY_RESTRICT acc_s) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V e0 = hn::Zero(d), e1 = e0, e2 = e0, e3 = e0, e4 = e0, e5 = e0, e6 = e0, e7 = e0, e8 = e0;
  V o0 = e0, o1 = e0, o2 = e0, o3 = e0, o4 = e0, o5 = e0, o6 = e0, o7 = e0, o8 = e0;
  const auto add = [&](V pj, const float* HWY_RESTRICT r, V& x0, V& x1, V& x2, V& x3, V& x4,
                       V& x5, V& x6, V& x7, V& x8) {
    x0 = hn::MulAdd(pj, ShiftedChunk<0, kC>(d, r, first, last), x0);
    if constexpr (kC > 1) x1 = hn::MulAdd(pj, ShiftedChunk<1, kC>(d, r, first, last), x1);
    if constexpr (kC > 2) x2 = hn::MulAdd(pj, ShiftedChunk<2, kC>(d, r, first, last), x2);
    if constexpr (kC > 3) x3 = hn::MulAdd(pj, ShiftedChunk<3, kC>(d, r, first, last), x3);
    if constexpr (kC > 4) x4 = hn::MulAdd(pj, ShiftedChunk<4, kC>(d, r, first, last), x4);
    if constexpr (kC > 5) x5 = hn::MulAdd(pj, ShiftedChunk<5, kC>(d, r, first, last), x5);
    if constexpr (kC > 6) x6 = hn::MulAdd(pj, ShiftedChunk<6, kC>(d, r, first, last), x6);
    if constexpr (kC > 7) x7 = hn::MulAdd(pj, ShiftedChunk<7, kC>(d, r, first, last), x7);
    if constexpr (kC > 8) x8 = hn::MulAdd(pj, ShiftedChunk<8, kC>(d, r, first, last), x8);
  };
  const float* HWY_RESTRICT v_j = v_al;
  size_t j = 0;
  for (; j + 2 <= n; j += 2, v_j += 2 * ldv) {
    add(hn::Set(d, p[j]), v_j, e0, e1, e2, e3, e4, e5, e6, e7, e8);
    add(hn::Set(d, p[j + 1]), v_j + ldv, o0, o1, o2, o3, o4, o5, o6, o7, o8);
  }
  if (j < n) add(hn::Set(d, p[j]), v_j, e0, e1, e2, e3, e4, e5, e6, e7, e8);
  const auto vcorr = hn::Set(d, corr);
  const auto fold = [&](size_t c, V e, V o) {
    hn::Store(hn::MulAdd(hn::Load(d, acc_s + 16 * c), vcorr, hn::Add(e, o)), d, acc_s + 16 * c);
  };
  fold(0, e0, o0);
  if constexpr (kC > 1) fold(1, e1, o1);
  if constexpr (kC > 2) fold(2, e2, o2);
  if constexpr (kC > 3) fold(3, e3, o3);
  if constexpr (kC > 4) fold(4, e4, o4);
  if constexpr (kC > 5) fold(5, e5, o5);
  if constexpr (kC > 6) fold(6, e6, o6);
  if constexpr (kC > 7) fold(7, e7, o7);
  if constexpr (kC > 8) fold(8, e8, o8);
}

// Calls f(std::integral_constant<size_t, c>) for c = chunks: 4 or 5 (L = 64),
// 8 or 9 (L = 128).
template <class F>
HWY_INLINE void WithChunks(size_t chunks, const F& f) {
  switch (chunks) {
    case 4: return f(std::integral_constant<size_t, 4>());
    case 5: return f(std::integral_constant<size_t, 5>());
    case 8: return f(std::integral_constant<size_t, 8>());
    default: return f(std::integral_constant<size_t, 9>());
  }
}

// FlashAttentionRowByDot over f32 K and V rows read in their aligned frames
// (ShiftedFrameFits for both).
HWY_NOINLINE void FlashAttentionRowByDotShifted(const AttnDims& a, const float* HWY_RESTRICT q_i,
                                                const ShiftedRows& k, const ShiftedRows& v,
                                                size_t visible, size_t key_begin,
                                                size_t key_end, float* HWY_RESTRICT acc,
                                                float* m, float* l, float* bad,
                                                float* HWY_RESTRICT s_row) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const hn::ScalableTag<float> d;
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
  const auto k_first = hn::Not(hn::FirstN(d, k.shift));
  const auto k_last = hn::FirstN(d, k.shift + L - 16 * (k.chunks - 1));
  const auto v_first = hn::Not(hn::FirstN(d, v.shift));
  const auto v_last = hn::FirstN(d, v.shift + L - 16 * (v.chunks - 1));
  HWY_ALIGN float qs[16 * kMaxShiftedChunks] = {};
  HWY_ALIGN float acc_s[16 * kMaxShiftedChunks] = {};
  memcpy(qs + k.shift, q_i, L * sizeof(float));
  memcpy(acc_s + v.shift, acc, L * sizeof(float));
  const __m512i rotate = _mm512_and_si512(
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(k.shift)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
      _mm512_set1_epi32(15));
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    const float* HWY_RESTRICT k_tile = k.al + j0 * k.ld;
    const float* HWY_RESTRICT v_tile = v.al + j0 * v.ld;
    size_t done = 0;
    WithChunks(k.chunks, [&](auto kc) {
      done = RowScoresShifted<decltype(kc)::value>(qs, k_tile, k.ld, nj, k_first, k_last,
                                                   rotate, scale2, s_row, v_tile, v.ld,
                                                   v.chunks * 64, end - j0, a.prefetch_kv);
    });
    // The rest of the tile's keys as FlashAttentionRowByDot scores them.
    const float* HWY_RESTRICT k_rows = k_tile + k.shift;
    const float* HWY_RESTRICT v_rows = v_tile + v.shift;
    for (size_t j = done; j < nj; ++j) {
      if (a.prefetch_kv) {
        if (j0 + j + kPrefetchKeys < end) {
          PrefetchKvRow(k_rows + (j + kPrefetchKeys) * k.ld, L * sizeof(float));
        }
        PrefetchKvRow(v_rows + j * v.ld, L * sizeof(float));
      }
      s_row[j] = scale2 * Dot(q_i, k_rows + j * k.ld, L);
    }
    float correction;
    const TileStep step = RowTileSoftmax(s_row, nj, m, l, bad, &correction);
    if (step == TileStep::kBad) break;
    if (step == TileStep::kSkip) continue;
    WithChunks(v.chunks, [&](auto vc) {
      RescaleAddShifted<decltype(vc)::value>(s_row, nj, v_tile, v.ld, v_first, v_last,
                                             correction, acc_s);
    });
  }
  memcpy(acc, acc_s + v.shift, L * sizeof(float));
}
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

// The streaming decode kernels' tiles (FlashAttentionRowStream, FlashAttentionRowStreamNarrow):
// keys per tile, and how many keys ahead the K and V rows are prefetched.
constexpr size_t kStreamKeys = 16;
constexpr size_t kStreamAhead = 8;

// A stream's prefetch of the K and the V row of key j (rows of row_bytes),
// if there is one (j < end).
template <class T>
HWY_INLINE void PrefetchStreamKey(const T* HWY_RESTRICT k_g, size_t ldk, const T* HWY_RESTRICT v_g,
                                  size_t ldv, size_t j, size_t end, size_t row_bytes) {
  if (j < end) {
    PrefetchKvRow(k_g + j * ldk, row_bytes);
    PrefetchKvRow(v_g + j * ldv, row_bytes);
  }
}

#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE && !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3)
// One query row over 16-bit K and V rows read from memory (a decode step
// over a long f16 or bf16 cache, AttnDims::prefetch_kv; f32 rows too where
// the keys go one at a time: see RowStreams), on targets with 32
// vector registers, L = kC vectors (kC <= 8): q and the row's accumulator
// stay in registers for the whole key range, and the keys go by in tiles of
// kStreamKeys (the scores of one tile, then its P V), so that the K and the
// V stream are read side by side, a few rows apart, instead of a 512-key
// tile of K and then its V.  Each group of eight keys prefetches the K and
// the V rows kStreamAhead keys on.  bf16 rows are read as element pairs
// (LoadBf16Pair: one integer op per vector instead of two), q and the
// accumulator deinterleaved the same way once per call.  The online softmax
// per tile is RowTileSoftmax's, its correction skipped while the max stays
// (it would be exactly 1).
// Measured on the Sapphire Rapids VM with a model of both loops in
// intrinsics (one thread, bf16 L=128, 512 MB of K/V, rounds alternated,
// medians; the probe summing the same bytes = 100%): the 512-key tiles,
// widened, 74%; 16-key tiles 82%; with pairs 87%; V prefetched 8 keys ahead
// too 90%; 8- and 32-key tiles 85-86%.  The kernel against the 512-key
// dot path (H=32 L=128 Skv=32768, paired): bf16 45.0 -> 39.1 ms on one
// thread, 23.1 -> 20.3 on two; f16 44.0 -> 40.9, 22.6 -> 21.5.  4, 12 or 16
// keys ahead, 8- or 32-key tiles, no K or no V prefetch: 0.82-0.98 (bf16).
// With AttnDims::stream_key_by_key (AMD CPUs: see RowStreamFor) a tile's
// keys are scored one at a time, each dot product reduced on its own, and
// nothing is prefetched by software.  On the Zen 4 VM a copy of this kernel
// over one 64 MB bf16 K and V stream (one thread, no software prefetch)
// took 45-51 ns a key with eight-key groups and 17-20 ns key by key (f16
// 39-43 -> 17-20); in the library, over the same stream, key by key took
// 31-53 ns with the prefetches and 20-23 without.  (Why eight
// rows' loads together stall there and one row's do not was not found out:
// no hardware counters in that VM.)

template <size_t kC, class T>
HWY_NOINLINE void FlashAttentionRowStream(const AttnDims& a, const float* HWY_RESTRICT q_i,
                                          const T* HWY_RESTRICT k_g, size_t ldk,
                                          const T* HWY_RESTRICT v_g, size_t ldv,
                                          size_t key_begin, size_t end, float* HWY_RESTRICT acc,
                                          float* m, float* l, float* bad) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr bool kPairs = std::is_same_v<T, hwy::bfloat16_t> && kC % 2 == 0;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const size_t row_bytes = kC * N * sizeof(T);
  const float scale2 = Base2Scale(a);
  // A row's kC vectors in the order of `load`: bf16 pairs even then odd.
  const auto load = [&](const T* HWY_RESTRICT p, V* x) {
    if constexpr (kPairs) {
      HWY_UNROLL(4)
      for (size_t c = 0; c < kC; c += 2) LoadBf16Pair(d, p + c * N, x[c], x[c + 1]);
    } else {
      HWY_UNROLL(8)
      for (size_t c = 0; c < kC; ++c) x[c] = LoadF32(d, p + c * N);
    }
  };
  V q[kC], o[kC];
  HWY_UNROLL(8)
  for (size_t c = 0; c < kC; c += (kPairs ? 2 : 1)) {
    if constexpr (kPairs) {
      hn::LoadInterleaved2(d, q_i + c * N, q[c], q[c + 1]);
      hn::LoadInterleaved2(d, acc + c * N, o[c], o[c + 1]);
    } else {
      q[c] = hn::LoadU(d, q_i + c * N);
      o[c] = hn::LoadU(d, acc + c * N);
    }
  }
  const auto dot = [&](const T* HWY_RESTRICT k_row) {
    V x[kC];
    load(k_row, x);
    V s = hn::Mul(q[0], x[0]);
    HWY_UNROLL(8)
    for (size_t c = 1; c < kC; ++c) s = hn::MulAdd(q[c], x[c], s);
    return s;
  };
  const bool by_key = a.stream_key_by_key;
  const auto prefetch = [&](size_t j) {
    if (!by_key) PrefetchStreamKey(k_g, ldk, v_g, ldv, j, end, row_bytes);
  };
  for (size_t j = key_begin; j < key_begin + kStreamAhead; ++j) prefetch(j);
  HWY_ALIGN float s[kStreamKeys];
  for (size_t j0 = key_begin; j0 < end; j0 += kStreamKeys) {
    const size_t nj = end - j0 < kStreamKeys ? end - j0 : kStreamKeys;
    const T* HWY_RESTRICT k_tile = k_g + j0 * ldk;
    size_t j = 0;
    // AttnDims::stream_key_by_key: every key by the one-key loop below.
    for (; !by_key && j + 8 <= nj; j += 8) {
      for (size_t t = 0; t < 8; ++t) prefetch(j0 + j + kStreamAhead + t);
      const T* HWY_RESTRICT k0 = k_tile + j * ldk;
      HWY_ALIGN float s8[8];
      StoreSumsOfLanes8(d, dot(k0), dot(k0 + ldk), dot(k0 + 2 * ldk), dot(k0 + 3 * ldk),
                        dot(k0 + 4 * ldk), dot(k0 + 5 * ldk), dot(k0 + 6 * ldk),
                        dot(k0 + 7 * ldk), s8);
      ScaleEight(s8, scale2, s + j);
    }
    for (; j < nj; ++j) {
      prefetch(j0 + j + kStreamAhead);
      s[j] = scale2 * hn::GetLane(hn::SumOfLanes(d, dot(k_tile + j * ldk)));
    }
    // RowTileSoftmax, the accumulator in registers.
    const float tile_max = RowMax(s, nj);
    if (!(tile_max < std::numeric_limits<float>::infinity())) {  // NaN or +inf
      *bad = 1.0f;
      break;
    }
    const float m_new = HWY_MAX(*m, tile_max);
    if (m_new == kNegInf) continue;
    if (m_new != *m) {
      const float correction = *m == kNegInf ? 0.0f : std::exp2(*m - m_new);
      const V vc = hn::Set(d, correction);
      HWY_UNROLL(8)
      for (size_t c = 0; c < kC; ++c) o[c] = hn::Mul(o[c], vc);
      *l *= correction;
      *m = m_new;
    }
    *l += ExpShiftedRow</*kBase2=*/true>(s, nj, m_new, s);
    const T* HWY_RESTRICT v_j = v_g + j0 * ldv;
    for (size_t jj = 0; jj < nj; ++jj, v_j += ldv) {
      const V p = hn::Set(d, s[jj]);
      V x[kC];
      load(v_j, x);
      HWY_UNROLL(8)
      for (size_t c = 0; c < kC; ++c) o[c] = hn::MulAdd(p, x[c], o[c]);
    }
  }
  HWY_UNROLL(8)
  for (size_t c = 0; c < kC; c += (kPairs ? 2 : 1)) {
    if constexpr (kPairs) {
      hn::StoreInterleaved2(o[c], o[c + 1], d, acc + c * N);
    } else {
      hn::StoreU(o[c], d, acc + c * N);
    }
  }
}

#endif

#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 && HWY_TARGET != HWY_SCALAR
// FlashAttentionRowStream for x86 targets with 16 vector registers (AVX2,
// SSE4, SSSE3), where q and a row's accumulator no longer fit in registers
// beside the loads (L = 128 is 16 AVX2 vectors): q is read from its row
// (L1) into each key's dot product, four chains per key, the key's sum
// reduced on its own (key by key: no eight accumulators to spare), and the
// tile's P V goes through the accumulator in blocks of up to eight vectors
// (StreamPvBlock), each block kept in registers over the tile's kStreamKeys
// V rows (the rows stay in L1 between blocks).  Tiles of kStreamKeys keys
// as there, the online softmax RowTileSoftmax (the rescaling skipped where
// the max stays: the correction is then exactly 1), and the K and the V row
// kStreamAhead keys on prefetched into L1 key by key, whatever
// AttnDims::stream_key_by_key says: without the prefetch the stream read
// 13.0 GB/s, with it 16.6 (f16) and 17.3 (bf16) on the Zen 3 VM (a model of
// this loop over 512 MB of K/V, one thread, medians of 7; the probe summing
// the same bytes 21.5-22.6; 4 keys ahead 16.5-16.7, 16 or 32 15.2-15.4, an
// L2 prefetch 32-128 keys ahead as well 15.1-15.6, 32-key tiles 14.2).
template <size_t kB, class T>
HWY_INLINE void StreamPvBlock(const float* HWY_RESTRICT s, size_t nj, const T* HWY_RESTRICT v_j,
                              size_t ldv, float* HWY_RESTRICT acc_c) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  V o[kB];
  HWY_UNROLL(8)
  for (size_t c = 0; c < kB; ++c) o[c] = hn::LoadU(d, acc_c + c * N);
  for (size_t jj = 0; jj < nj; ++jj, v_j += ldv) {
    const V p = hn::Set(d, s[jj]);
    HWY_UNROLL(8)
    for (size_t c = 0; c < kB; ++c) o[c] = hn::MulAdd(p, LoadF32(d, v_j + c * N), o[c]);
  }
  HWY_UNROLL(8)
  for (size_t c = 0; c < kB; ++c) hn::StoreU(o[c], d, acc_c + c * N);
}

template <class T>
HWY_NOINLINE void FlashAttentionRowStreamNarrow(const AttnDims& a, const float* HWY_RESTRICT q_i,
                                                const T* HWY_RESTRICT k_g, size_t ldk,
                                                const T* HWY_RESTRICT v_g, size_t ldv,
                                                size_t key_begin, size_t end,
                                                float* HWY_RESTRICT acc, float* m, float* l,
                                                float* bad) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d), L = a.head_dim, C = L / N;
  const size_t row_bytes = L * sizeof(T);
  const float scale2 = Base2Scale(a);
  const auto dot = [&](const T* HWY_RESTRICT k_row) {
    V s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
    size_t c = 0;
    for (; c + 4 <= C; c += 4) {
      s0 = hn::MulAdd(hn::LoadU(d, q_i + c * N), LoadF32(d, k_row + c * N), s0);
      s1 = hn::MulAdd(hn::LoadU(d, q_i + (c + 1) * N), LoadF32(d, k_row + (c + 1) * N), s1);
      s2 = hn::MulAdd(hn::LoadU(d, q_i + (c + 2) * N), LoadF32(d, k_row + (c + 2) * N), s2);
      s3 = hn::MulAdd(hn::LoadU(d, q_i + (c + 3) * N), LoadF32(d, k_row + (c + 3) * N), s3);
    }
    for (; c < C; ++c) s0 = hn::MulAdd(hn::LoadU(d, q_i + c * N), LoadF32(d, k_row + c * N), s0);
    return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  };
  const auto prefetch = [&](size_t j) { PrefetchStreamKey(k_g, ldk, v_g, ldv, j, end, row_bytes); };
  for (size_t j = key_begin; j < key_begin + kStreamAhead; ++j) prefetch(j);
  HWY_ALIGN float s[kStreamKeys];
  for (size_t j0 = key_begin; j0 < end; j0 += kStreamKeys) {
    const size_t nj = end - j0 < kStreamKeys ? end - j0 : kStreamKeys;
    const T* HWY_RESTRICT k_tile = k_g + j0 * ldk;
    for (size_t j = 0; j < nj; ++j) {
      prefetch(j0 + j + kStreamAhead);
      s[j] = scale2 * dot(k_tile + j * ldk);
    }
    float correction;
    const TileStep step = RowTileSoftmax(s, nj, m, l, bad, &correction);
    if (step == TileStep::kBad) break;
    if (step == TileStep::kSkip) continue;
    if (correction != 1.0f) {  // the max moved: the accumulator rescaled in place
      const V vc = hn::Set(d, correction);
      for (size_t c = 0; c < C; ++c) {
        hn::StoreU(hn::Mul(hn::LoadU(d, acc + c * N), vc), d, acc + c * N);
      }
    }
    const T* HWY_RESTRICT v_tile = v_g + j0 * ldv;
    size_t c0 = 0;
    for (; c0 + 8 <= C; c0 += 8) StreamPvBlock<8>(s, nj, v_tile + c0 * N, ldv, acc + c0 * N);
    const T* HWY_RESTRICT v_c = v_tile + c0 * N;
    float* HWY_RESTRICT acc_c = acc + c0 * N;
    switch (C - c0) {
      case 1: StreamPvBlock<1>(s, nj, v_c, ldv, acc_c); break;
      case 2: StreamPvBlock<2>(s, nj, v_c, ldv, acc_c); break;
      case 3: StreamPvBlock<3>(s, nj, v_c, ldv, acc_c); break;
      case 4: StreamPvBlock<4>(s, nj, v_c, ldv, acc_c); break;
      case 5: StreamPvBlock<5>(s, nj, v_c, ldv, acc_c); break;
      case 6: StreamPvBlock<6>(s, nj, v_c, ldv, acc_c); break;
      case 7: StreamPvBlock<7>(s, nj, v_c, ldv, acc_c); break;
      default: break;
    }
  }
}
#endif

#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
// Whether FlashAttentionRowByDot runs on FlashAttentionRowStream: K and V
// of one dtype read from memory, L a whole number of vectors, up to 8, on a
// CPU where dispatch prefers it (AttnDims::row_stream); f32 rows only key by
// key (AttnDims::stream_key_by_key), the eight-key stream having been
// measured for 16-bit rows alone.  f32 rows key by key against the 512-key
// tiles (aligned rows) or their aligned-frame form (rows 16 bytes off), on
// the Zen 4 VM (a copy of both over one 64 MB f32 K and V stream, L=128,
// one thread, 15 rounds alternated, medians): 16 bytes off 57.2 -> 46.6 ns
// a key (17.9 -> 22.0 GB/s), aligned 58.4 -> 47.2; the eight-key stream
// with its prefetches 59.9 / 55.6.
// On the x86 targets with 16 registers (FlashAttentionRowStreamNarrow) L
// may be any whole number of vectors, and the stream keys go key by key
// with the prefetch whichever AttnDims::stream_key_by_key asks for.
template <class TK, class TV>
HWY_INLINE bool RowStreams(const AttnDims& a) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
  constexpr size_t kMaxVectors = ~size_t{0};
#else
  constexpr size_t kMaxVectors = 8;
#endif
  return std::is_same_v<TK, TV> && (!std::is_same_v<TK, float> || a.stream_key_by_key) &&
         a.prefetch_kv && a.row_stream && a.head_dim % N == 0 && a.head_dim / N >= 1 &&
         a.head_dim / N <= kMaxVectors;
}
#endif

// One query row on dot products (decode): keys [key_begin, key_end) of K
// and V rows `ldk` / `ldv` elements apart, read in place in their own
// element type (f32, or 16-bit widened in registers): a decode step over a
// long cache reads each byte once.  Keys eight at a time (RowScores8), the
// rest (and every key on SCALAR) one at a time; from DRAM, while the scores
// of a tile are computed, the next K rows and the tile's V rows are
// prefetched, so that both streams are in flight.
template <class TK, class TV>
HWY_NOINLINE void FlashAttentionRowByDot(const AttnDims& a, const float* HWY_RESTRICT q_i,
                                         const TK* HWY_RESTRICT k_g, size_t ldk,
                                         const TV* HWY_RESTRICT v_g, size_t ldv,
                                         size_t visible, size_t key_begin, size_t key_end,
                                         float* HWY_RESTRICT acc, float* m, float* l,
                                         float* bad, float* HWY_RESTRICT s_row) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE && !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3)
  if constexpr (std::is_same_v<TK, TV>) {
    if (RowStreams<TK, TV>(a)) {
      const auto run = [&](auto kc) {
        FlashAttentionRowStream<decltype(kc)::value>(a, q_i, k_g, ldk, v_g, ldv, key_begin, end,
                                                     acc, m, l, bad);
      };
      switch (L / hn::Lanes(hn::ScalableTag<float>())) {
        case 1: return run(std::integral_constant<size_t, 1>());
        case 2: return run(std::integral_constant<size_t, 2>());
        case 3: return run(std::integral_constant<size_t, 3>());
        case 4: return run(std::integral_constant<size_t, 4>());
        case 5: return run(std::integral_constant<size_t, 5>());
        case 6: return run(std::integral_constant<size_t, 6>());
        case 7: return run(std::integral_constant<size_t, 7>());
        default: return run(std::integral_constant<size_t, 8>());
      }
    }
  }
#endif
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 && HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<TK, TV>) {
    if (RowStreams<TK, TV>(a)) {
      FlashAttentionRowStreamNarrow(a, q_i, k_g, ldk, v_g, ldv, key_begin, end, acc, m, l, bad);
      return;
    }
  }
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3  // FlashAttentionRowByDotShifted
  if constexpr (std::is_same_v<TK, float> && std::is_same_v<TV, float>) {
    if (((reinterpret_cast<uintptr_t>(k_g) | reinterpret_cast<uintptr_t>(v_g)) % 64 != 0) &&
        ShiftedFrameFits(k_g, ldk, L) && ShiftedFrameFits(v_g, ldv, L)) {
      FlashAttentionRowByDotShifted(a, q_i, ShiftedRows(k_g, ldk, L), ShiftedRows(v_g, ldv, L),
                                    visible, key_begin, key_end, acc, m, l, bad, s_row);
      return;
    }
  }
#endif
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    const TK* HWY_RESTRICT k_tile = k_g + j0 * ldk;
    const TV* HWY_RESTRICT v_tile = v_g + j0 * ldv;
    const size_t done = RowScores8(q_i, k_tile, ldk, nj, L, scale2, s_row, v_tile, ldv,
                                   end - j0, a.prefetch_kv);
    for (size_t j = done; j < nj; ++j) {
      if (a.prefetch_kv) {
        if (j0 + j + kPrefetchKeys < end) {
          PrefetchKvRow(k_tile + (j + kPrefetchKeys) * ldk, L * sizeof(TK));
        }
        PrefetchBytes</*kIntoL2=*/true>(v_tile + j * ldv, L * sizeof(TV));  // as PrefetchGroup8
      }
      s_row[j] = scale2 * Dot(q_i, k_tile + j * ldk, L);
    }
    float correction;
    const TileStep step = RowTileSoftmax(s_row, nj, m, l, bad, &correction);
    if (step == TileStep::kBad) return;
    if (step == TileStep::kSkip) continue;
    RescaleAddWeightedRows(s_row, nj, v_tile, ldv, L, correction, acc);
  }
}

// FlashAttentionRowByDot for K and V of their views' dtypes.  K and V of one
// dtype (the usual cache) are read in place; the rare mixed pair (say f16 K,
// bf16 V) is widened tile by tile into scratch first, so that only three
// instantiations of the dot path are compiled per target, not nine.
inline void RowByDot(const AttnDims& a, const float* HWY_RESTRICT q_i, const KvRows& k_g,
                     const KvRows& v_g, size_t visible, size_t key_begin, size_t key_end,
                     float* HWY_RESTRICT acc, float* m, float* l, float* bad,
                     float* HWY_RESTRICT s_row) {
  if (k_g.dtype == v_g.dtype) {
    WithElementType(k_g.dtype, k_g.base, [&](const auto* k) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
      const T* v = reinterpret_cast<const T*>(v_g.base);
      FlashAttentionRowByDot(a, q_i, k, k_g.stride, v, v_g.stride, visible, key_begin,
                             key_end, acc, m, l, bad, s_row);
    });
    return;
  }
  const size_t L = a.head_dim, end = visible < key_end ? visible : key_end;
  for (size_t j0 = key_begin; j0 < end && *bad == 0.0f; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    size_t ldk, ldv;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    FlashAttentionRowByDot(a, q_i, k_tile, ldk, v_tile, ldv, nj, 0, nj, acc, m, l, bad, s_row);
  }
}

// Rows interleaved key by key: x[j * R + r] is row r's value at key j
// (j < keys).  Per row: the maximum (NaN when the row holds a NaN), the
// grouped decode's tile of scores in the order its reductions produce them.
template <size_t R>
HWY_INLINE void InterleavedRowMaxes(const float* HWY_RESTRICT x, size_t keys,
                                    float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d), n = keys * R;
  bool nan[R];
  for (size_t r = 0; r < R; ++r) {
    out[r] = -std::numeric_limits<float>::infinity();
    nan[r] = false;
  }
  size_t i = 0;
  if (N % R == 0 && n >= N) {  // lane t holds row t % R in every vector
    auto m = hn::Set(d, -std::numeric_limits<float>::infinity());
    auto is_nan = hn::Not(hn::Eq(m, m));
    for (; i + N <= n; i += N) {
      const auto v = hn::LoadU(d, x + i);
      m = hn::Max(m, v);
      is_nan = hn::Or(is_nan, hn::Not(hn::Eq(v, v)));
    }
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    HWY_ALIGN float nans[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(m, d, lanes);
    hn::Store(hn::IfThenElseZero(is_nan, hn::Set(d, 1.0f)), d, nans);
    for (size_t t = 0; t < N; ++t) {
      out[t % R] = lanes[t] > out[t % R] ? lanes[t] : out[t % R];
      nan[t % R] |= nans[t] != 0.0f;
    }
  }
  for (; i < n; ++i) {
    const size_t r = i % R;
    nan[r] |= x[i] != x[i];
    out[r] = x[i] > out[r] ? x[i] : out[r];
  }
  for (size_t r = 0; r < R; ++r) {
    if (nan[r]) out[r] = std::numeric_limits<float>::quiet_NaN();
  }
}

// x[j * R + r] = 2^(x[j * R + r] - shift[r]) in place for j < keys;
// sums[r] = the sum of row r's results in a fixed order.  shift[r] >= every
// value of row r (rows whose results the caller discards may hold anything).
template <size_t R>
HWY_INLINE void InterleavedExp2Shifted(float* HWY_RESTRICT x, size_t keys,
                                       const float* HWY_RESTRICT shift,
                                       float* HWY_RESTRICT sums) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d), n = keys * R;
  for (size_t r = 0; r < R; ++r) sums[r] = 0.0f;
  size_t i = 0;
  if (N % R == 0 && n >= N) {
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    for (size_t t = 0; t < N; ++t) lanes[t] = shift[t % R];
    const auto vshift = hn::Load(d, lanes);
    auto sum = hn::Zero(d);
    for (; i + N <= n; i += N) {
      const auto e = Exp2NonPositive(d, hn::Sub(hn::LoadU(d, x + i), vshift));
      hn::StoreU(e, d, x + i);
      sum = hn::Add(sum, e);
    }
    hn::Store(sum, d, lanes);
    for (size_t t = 0; t < N; ++t) sums[t % R] += lanes[t];
  }
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) {
    const size_t r = i % R;
    const auto e = Exp2NonPositive(d1, hn::Sub(hn::LoadU(d1, x + i), hn::Set(d1, shift[r])));
    hn::StoreU(e, d1, x + i);
    sums[r] += hn::GetLane(e);
  }
}

// The online softmax of a group's key tile (GroupByDot): s_keys[j * R + r]
// (row r's scores) become their weights P in place, and m, l, bad move on;
// corr[r] rescales row r's accumulator.  A row that is NaN already, turns
// NaN here or has seen nothing finite leaves its accumulator as it is
// (use[r] false), as the one-row path does.  Returns whether any row is used.
template <size_t R>
HWY_INLINE bool GroupTileSoftmax(float* HWY_RESTRICT s_keys, size_t nj, float* m, float* l,
                                 float* bad, float* corr, bool* use) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float tile_max[R], shift[R], tile_sum[R];
  bool any = false;
  InterleavedRowMaxes<R>(s_keys, nj, tile_max);
  for (size_t r = 0; r < R; ++r) {
    corr[r] = 1.0f;
    use[r] = false;
    shift[r] = 0.0f;  // a row not used: its P and its accumulator are discarded
    if (bad[r] != 0.0f) continue;  // already NaN: nothing more to add
    if (!(tile_max[r] < std::numeric_limits<float>::infinity())) {  // NaN or +inf
      bad[r] = 1.0f;
      continue;
    }
    const float m_new = HWY_MAX(m[r], tile_max[r]);
    if (m_new == kNegInf) continue;
    use[r] = true;
    shift[r] = m_new;
    corr[r] = m[r] == kNegInf ? 0.0f : std::exp2(m[r] - m_new);
    m[r] = m_new;
    any = true;
  }
  if (!any) return false;
  InterleavedExp2Shifted<R>(s_keys, nj, shift, tile_sum);
  for (size_t r = 0; r < R; ++r) {
    if (use[r]) l[r] = l[r] * corr[r] + tile_sum[r];
  }
  return true;
}

// Query rows that see the same keys, kGroupRows at a time, on dot products
// (the query heads of a GQA/MQA decode step: H/Hkv rows over one kv head's
// cache).  Each K and V row is read once for the rows of a group, in place
// in its own element type (16-bit widened in registers), and prefetched
// ahead: no K^T packing, which costs as much as the products at this size.
//   scores: per key, each K vector is multiplied into the rows' accumulators
//           (two keys at a time: 2 x kGroupRows independent chains), the
//           eight reduced across the lanes together (StoreSumsOfLanes8);
//   P V:    per block of columns, each V vector is loaded once and added into
//           every row's accumulators, kept in registers over a block of
//           kPvKeys keys (L = 64 on AVX-512: over the tile).
constexpr size_t kGroupRows = 4;
constexpr size_t kPvPrefetchKeys = 16;  // V rows prefetched ahead in P V (from DRAM)
constexpr size_t kPvKeys = 32;          // keys per block of P V (their V rows stay in L1)

// The grouped decode's prefetches in its scores loop for the n keys from j
// of a tile (K/V from DRAM): their K rows kPrefetchKeys ahead (those of the
// keys_left keys from the tile's first on), and the V rows of those of them
// below v_keys (the tile's first block of P V where P V prefetches each next
// block's V rows itself: see FlashAttentionGroupByDot).
template <class T>
HWY_INLINE void PrefetchGroupKeys(const T* HWY_RESTRICT k_tile, size_t ldk,
                                  const T* HWY_RESTRICT v_tile, size_t ldv, size_t j, size_t n,
                                  size_t keys_left, size_t L, size_t v_keys) {
  for (size_t ahead = j + kPrefetchKeys; ahead < j + kPrefetchKeys + n; ++ahead) {
    if (ahead < keys_left) PrefetchKvRow(k_tile + ahead * ldk, L * sizeof(T));
  }
  for (size_t i = j; i < j + n; ++i) {
    if (i < v_keys) PrefetchKvRow(v_tile + i * ldv, L * sizeof(T));
  }
}

// The lines of `rows` rows of `bytes` bytes each, `ld` bytes apart from
// `first`, prefetched in address order, n lines a call to Some.
template <bool kIntoL2>  // f32 rows (PrefetchKvRow)
class RowLinePrefetcher {
 public:
  RowLinePrefetcher(const void* first, size_t ld, size_t bytes, size_t rows)
      : row_(static_cast<const char*>(first)), ld_(ld), bytes_(bytes), rows_left_(rows) {
    if (rows_left_ != 0) Start();
  }
  HWY_INLINE void Some(size_t n) {
    for (size_t i = 0; i < n && rows_left_ != 0; ++i) {
      if constexpr (kIntoL2) {
        PrefetchIntoL2(ptr_);
      } else {
        hwy::Prefetch(ptr_);
      }
      asm volatile("" : : "r"(ptr_));  // GCC 12 deletes prefetch-only loops
      ptr_ += 64;
      if (ptr_ >= row_ + bytes_) {  // the row's last line: on to the next row
        if (--rows_left_ == 0) return;
        row_ += ld_;
        Start();
      }
    }
  }

 private:
  void Start() {
    ptr_ = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row_) & ~uintptr_t{63});
  }
  const char* row_;
  const char* ptr_ = nullptr;
  size_t ld_, bytes_, rows_left_;
};

// The grouped P V's prefetches over a block of nb keys from jb of a tile of
// nj (K/V from DRAM, P V in `passes` passes of whole vectors over each
// block): the next block's V rows, so that V streams while P V runs, a
// block ahead (~400 ns at L = 128 on Zen 3).  *lines: their lines (0:
// none), for SpreadLines to issue over the block's passes * nb calls.
template <class T>
HWY_INLINE RowLinePrefetcher<sizeof(T) == 4> NextPvBlock(const AttnDims& a, const T* v_tile, size_t ldv,
                                         size_t jb, size_t nj, size_t passes, size_t* lines) {
  const size_t next = jb + kPvKeys;
  const size_t rows = a.prefetch_kv && passes != 0 && next < nj ? HWY_MIN(kPvKeys, nj - next) : 0;
  const size_t bytes = a.head_dim * sizeof(T);
  *lines = rows * ((bytes + 63) / 64 + 1);  // at most, for rows off the lines
  return RowLinePrefetcher<sizeof(T) == 4>(rows != 0 ? v_tile + next * ldv : v_tile,
                                           ldv * sizeof(T), bytes, rows);
}

// NextPvBlock's lines spread evenly over the block's calls: at each call
// a credit of `lines`, and a line for each `calls` of it (a line at most
// when kOne: fewer lines than calls).  (Issued a line a call from the
// block's first, they went out faster than memory delivers and the loop
// stalled on them with the miss buffers full.  Zen 3 VM, H=32 Hkv=8 L=128
// Skv=32768, 8 alternated rounds, medians, one / two threads: bf16 K/V
// 10.03 -> 9.23 / 5.08 -> 4.73 ms, f32 17.17 -> 16.30 / 10.13 -> 9.88, f16
// 8.98 -> 9.19 / 4.61 -> 4.61.  The same prefetches written as a method of
// RowLinePrefetcher, or the bf16 loop with `while` for its `if`, ran 4-10%
// slower again, for reasons not found: see
// bench/results/2026-12-05-zen3-session21.md.)
template <bool kOne, bool kIntoL2>
HWY_INLINE void SpreadLines(RowLinePrefetcher<kIntoL2>& next, size_t& credit, size_t lines,
                            size_t calls) {
  credit += lines;
  if constexpr (kOne) {
    if (credit >= calls) {
      credit -= calls;
      next.Some(1);
    }
  } else {
    while (credit >= calls) {
      credit -= calls;
      next.Some(1);
    }
  }
}

// Vectors of columns the grouped P V takes at a time from column cc (lv
// columns in whole vectors of N): on AVX2 three (12 FMA chains: a pair's 8
// leave the FMA latency no slack, as in the scores) while more than four
// remain (L = 128: four triples, then two pairs); else two.
inline size_t GroupPvVecs(size_t cc, size_t lv, size_t N) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if (cc + 3 * N <= lv && lv - cc != 4 * N) return 3;
#endif
  (void)cc;
  (void)lv;
  (void)N;
  return 2;
}

// One block of kVecs (2 or 3) vectors of columns of the grouped P V over
// keys [jb, jb + nb) of a tile: o_tmp[r][cc, cc + kVecs N) (+)= sum_j
// P[r][j] V[j] for the kGroupRows rows, the sums carried in o_tmp from one
// key block to the next (started at zero when `first`).  load(v, x0, x1,
// x2) reads the kVecs vectors of V at v (in column order, or as
// deinterleaved pairs: the sums then come out in that order; x2 only when
// kVecs = 3); prefetch(j) is called once per key when `prefetching`.
template <size_t kVecs, class T, class Load, class Prefetch>
HWY_INLINE void GroupPvBlock(const Load& load, const T* HWY_RESTRICT v_tile, size_t ldv,
                             const float* HWY_RESTRICT s_keys, size_t jb, size_t nb,
                             size_t cc, size_t L, bool first, bool prefetching,
                             const Prefetch& prefetch, float* HWY_RESTRICT o_tmp) {
  static_assert(kVecs == 2 || kVecs == 3, "two or three vectors of columns");
  constexpr size_t R = kGroupRows;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const auto start = [&](size_t r, size_t x) {
    return first ? hn::Zero(d) : hn::LoadU(d, o_tmp + r * L + cc + x * N);
  };
  V o00 = start(0, 0), o01 = start(0, 1), o10 = start(1, 0), o11 = start(1, 1);
  V o20 = start(2, 0), o21 = start(2, 1), o30 = start(3, 0), o31 = start(3, 1);
  V o02 = o00, o12 = o00, o22 = o00, o32 = o00;
  if constexpr (kVecs == 3) {
    o02 = start(0, 2);
    o12 = start(1, 2);
    o22 = start(2, 2);
    o32 = start(3, 2);
  }
  const T* HWY_RESTRICT v_c = v_tile + jb * ldv + cc;
  const float* HWY_RESTRICT p_j = s_keys + jb * R;
  // One weight register at a time (8 or 12 accumulators + the V vectors +
  // 1): with all four weights live GCC spilled an accumulator to the stack
  // and the loop ran at the store-to-load latency.
  for (size_t jj = 0; jj < nb; ++jj, v_c += ldv, p_j += R) {
    if (prefetching) prefetch(jb + jj);
    V x0, x1, x2;
    load(v_c, x0, x1, x2);
    const auto add = [&](float w, V& y0, V& y1, V& y2) {
      const V p = hn::Set(d, w);
      y0 = hn::MulAdd(p, x0, y0);
      y1 = hn::MulAdd(p, x1, y1);
      if constexpr (kVecs == 3) y2 = hn::MulAdd(p, x2, y2);
    };
    add(p_j[0], o00, o01, o02);
    add(p_j[1], o10, o11, o12);
    add(p_j[2], o20, o21, o22);
    add(p_j[3], o30, o31, o32);
  }
  const auto store = [&](size_t r, V y0, V y1, V y2) {
    hn::StoreU(y0, d, o_tmp + r * L + cc);
    hn::StoreU(y1, d, o_tmp + r * L + cc + N);
    if constexpr (kVecs == 3) hn::StoreU(y2, d, o_tmp + r * L + cc + 2 * N);
  };
  store(0, o00, o01, o02);
  store(1, o10, o11, o12);
  store(2, o20, o21, o22);
  store(3, o30, o31, o32);
}

template <class T>
HWY_NOINLINE void FlashAttentionGroupByDot(const AttnDims& a, const float* HWY_RESTRICT q_blk,
                                           size_t ldq, const T* HWY_RESTRICT k_g, size_t ldk,
                                           const T* HWY_RESTRICT v_g, size_t ldv,
                                           size_t visible, size_t key_begin, size_t key_end,
                                           float* HWY_RESTRICT acc, float* m, float* l,
                                           float* bad, float* HWY_RESTRICT s_keys,
                                           float* HWY_RESTRICT o_tmp) {
  constexpr size_t R = kGroupRows;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
  const size_t lv = L / N * N;  // columns in whole vectors; the rest lane by lane
  // P V's passes of two or three vectors of columns over a block of keys
  // (none: one pass over all the keys, or narrower ones only).  With them,
  // K/V from DRAM, P V prefetches each next block's V rows, spread over the
  // block's passes (a block, ~400 ns at L = 128, ahead), and the scores
  // loop only the first block's; without them the scores loop prefetches
  // all the tile's V rows.  (Until the twentieth session the scores loop
  // prefetched them all, so it asked for twice the bytes a key that P V
  // asked for (none: V in L2): memory and arithmetic overlapped only in
  // part.  H=32 Hkv=8 L=128 Skv=32768, Zen 3 VM, 5 alternated rounds,
  // medians: f16 one thread 10.49 -> 9.63 ms, two threads 5.93 -> 5.09,
  // f32 one thread 21.08 -> 18.59.)
  size_t pv_passes = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (L != 4 * N)
#endif
  {
    for (size_t cc = 0; cc + 2 * N <= lv; cc += GroupPvVecs(cc, lv, N) * N) ++pv_passes;
  }
  const size_t v_keys = pv_passes == 0 ? kDotKeyTile : kPvKeys;
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    const T* HWY_RESTRICT k_tile = k_g + j0 * ldk;
    const T* HWY_RESTRICT v_tile = v_g + j0 * ldv;
    // S[r][j] = scale2 q_r . k_j at s_keys[j * R + r]: key-major, as the
    // reduction of a key pair gives them (one store), and the P V loop reads
    // each key's R weights from one place.
    // From DRAM: the K rows kPrefetchKeys ahead of the n keys from j, and
    // their V rows below v_keys.
    const auto prefetch_keys = [&](size_t j, size_t n) {
      if (a.prefetch_kv) PrefetchGroupKeys(k_tile, ldk, v_tile, ldv, j, n, end - j0, L, v_keys);
    };
    size_t j = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // L = 64 on AVX-512: the rows' 16 q vectors stay in registers (2 loads
    // per 8 FMAs instead of 6).  H=8 Hkv=2 decode, one thread, alternated
    // runs on Zen 5: Skv=2048 33.1 -> 29.7 us (buffers 16 bytes off 40.8 ->
    // 34.9), Skv=4096 68.7 -> 61.7 us (off 79.1 -> 68.4).
    if (L == 4 * N) {
      const auto qv = [&](size_t r, size_t c) { return hn::LoadU(d, q_blk + r * ldq + c * N); };
      const auto q00 = qv(0, 0), q01 = qv(0, 1), q02 = qv(0, 2), q03 = qv(0, 3);
      const auto q10 = qv(1, 0), q11 = qv(1, 1), q12 = qv(1, 2), q13 = qv(1, 3);
      const auto q20 = qv(2, 0), q21 = qv(2, 1), q22 = qv(2, 2), q23 = qv(2, 3);
      const auto q30 = qv(3, 0), q31 = qv(3, 1), q32 = qv(3, 2), q33 = qv(3, 3);
      for (; j + 2 <= nj; j += 2) {
        prefetch_keys(j, 2);
        const T* HWY_RESTRICT k0 = k_tile + j * ldk;
        const T* HWY_RESTRICT k1 = k0 + ldk;
        auto a00 = hn::Zero(d), a01 = hn::Zero(d), a02 = hn::Zero(d), a03 = hn::Zero(d);
        auto a10 = hn::Zero(d), a11 = hn::Zero(d), a12 = hn::Zero(d), a13 = hn::Zero(d);
        const auto step = [&](size_t c, decltype(a00) r0, decltype(a00) r1, decltype(a00) r2,
                              decltype(a00) r3) {
          const auto x0 = LoadF32(d, k0 + c), x1 = LoadF32(d, k1 + c);
          a00 = hn::MulAdd(r0, x0, a00);
          a01 = hn::MulAdd(r1, x0, a01);
          a02 = hn::MulAdd(r2, x0, a02);
          a03 = hn::MulAdd(r3, x0, a03);
          a10 = hn::MulAdd(r0, x1, a10);
          a11 = hn::MulAdd(r1, x1, a11);
          a12 = hn::MulAdd(r2, x1, a12);
          a13 = hn::MulAdd(r3, x1, a13);
        };
        step(0, q00, q10, q20, q30);
        step(N, q01, q11, q21, q31);
        step(2 * N, q02, q12, q22, q32);
        step(3 * N, q03, q13, q23, q33);
        HWY_ALIGN float s01[2 * R];
        StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s01);
        ScaleEight(s01, scale2, s_keys + j * R);
      }
    }
#endif
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
    // AVX2, f32 or f16 K and whole vectors: three keys at a time, 12
    // chains.  With a pair's 8 chains the FMA latency (4 cycles, 2 ports)
    // left no slack: a model of the loop with K in L1 (L=128, f16) took
    // 13.0-13.2 ns a key, three keys 11.6-11.7 (the FMA floor is 10).  Each
    // (row, key) chain and its reduction are the pair's, so the same bits.
    // (bf16 K: the widening's temporaries do not fit beside 12 chains in 16
    // registers; GCC spilled two of them.)
    if constexpr (!std::is_same_v<T, hwy::bfloat16_t>) {
      for (; lv == L && j + 3 <= nj; j += 3) {
        prefetch_keys(j, 3);
        const T* HWY_RESTRICT k0 = k_tile + j * ldk;
        const T* HWY_RESTRICT k1 = k0 + ldk;
        const T* HWY_RESTRICT k2 = k1 + ldk;
        auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00;
        auto a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        for (size_t c = 0; c < L; c += N) {
          const auto x0 = LoadF32(d, k0 + c), x1 = LoadF32(d, k1 + c), x2 = LoadF32(d, k2 + c);
          const auto row = [&](size_t r, decltype(a00)& s0, decltype(a00)& s1,
                               decltype(a00)& s2) {
            auto q = hn::LoadU(d, q_blk + r * ldq + c);
            KeepInRegister(q);
            s0 = hn::MulAdd(q, x0, s0);
            s1 = hn::MulAdd(q, x1, s1);
            s2 = hn::MulAdd(q, x2, s2);
          };
          row(0, a00, a10, a20);
          row(1, a01, a11, a21);
          row(2, a02, a12, a22);
          row(3, a03, a13, a23);
        }
        HWY_ALIGN float s012[3 * R];
        StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s012);
        StoreSumsOfLanes4(a20, a21, a22, a23, s012 + 2 * R);
        ScaleEight(s012, scale2, s_keys + j * R);
        for (size_t r = 0; r < R; ++r) s_keys[(j + 2) * R + r] = s012[2 * R + r] * scale2;
      }
    }
#endif
    for (; j + 2 <= nj; j += 2) {
      prefetch_keys(j, 2);
      const T* HWY_RESTRICT k0 = k_tile + j * ldk;
      const T* HWY_RESTRICT k1 = k0 + ldk;
      auto a00 = hn::Zero(d), a01 = hn::Zero(d), a02 = hn::Zero(d), a03 = hn::Zero(d);
      auto a10 = hn::Zero(d), a11 = hn::Zero(d), a12 = hn::Zero(d), a13 = hn::Zero(d);
      for (size_t c = 0; c < lv; c += N) {
        const auto x0 = LoadF32(d, k0 + c), x1 = LoadF32(d, k1 + c);
        auto q0 = hn::LoadU(d, q_blk + c), q1 = hn::LoadU(d, q_blk + ldq + c);
        auto q2 = hn::LoadU(d, q_blk + 2 * ldq + c), q3 = hn::LoadU(d, q_blk + 3 * ldq + c);
        KeepInRegister(q0);
        KeepInRegister(q1);
        KeepInRegister(q2);
        KeepInRegister(q3);
        a00 = hn::MulAdd(q0, x0, a00);
        a01 = hn::MulAdd(q1, x0, a01);
        a02 = hn::MulAdd(q2, x0, a02);
        a03 = hn::MulAdd(q3, x0, a03);
        a10 = hn::MulAdd(q0, x1, a10);
        a11 = hn::MulAdd(q1, x1, a11);
        a12 = hn::MulAdd(q2, x1, a12);
        a13 = hn::MulAdd(q3, x1, a13);
      }
      HWY_ALIGN float s01[2 * R];
      StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s01);
      float* s0 = s01;
      float* s1 = s01 + R;
      const hn::CappedTag<float, 1> d1;
      for (size_t c = lv; c < L; ++c) {
        const float x0 = hn::GetLane(LoadF32(d1, k0 + c)), x1 = hn::GetLane(LoadF32(d1, k1 + c));
        for (size_t r = 0; r < R; ++r) {
          s0[r] += q_blk[r * ldq + c] * x0;
          s1[r] += q_blk[r * ldq + c] * x1;
        }
      }
      // Keys j and j + 1, each its R rows: the reduction's own order.
      static_assert(2 * R == 8, "a key pair's sums are eight");
      ScaleEight(s01, scale2, s_keys + j * R);
    }
    for (; j < nj; ++j) {
      PrefetchKvRow(v_tile + j * ldv, L * sizeof(T));
      for (size_t r = 0; r < R; ++r) {
        s_keys[j * R + r] = scale2 * Dot(q_blk + r * ldq, k_tile + j * ldk, L);
      }
    }
    float corr[R];
    bool use[R];
    if (!GroupTileSoftmax<R>(s_keys, nj, m, l, bad, corr, use)) continue;
    // acc[r] = corr[r] acc[r] + sum_j P[r][j] V[j].
    // From DRAM, P V in one pass over the keys (L = 64 on AVX-512) or
    // narrower than two vectors: each V row kPvPrefetchKeys keys ahead, again
    // (the scores loop's prefetches of V, up to a tile of keys earlier, did
    // not keep them: on a Sapphire Rapids VM, H=32 Hkv=8 L=128 Skv=32768
    // bf16 K/V, one thread, the loads of V took ~40% of the samples).  P V
    // in passes over blocks of keys prefetches the next block instead.
    const auto prefetch_v = [&](size_t jj) {
      if (a.prefetch_kv && jj + kPvPrefetchKeys < nj) {
        PrefetchKvRow(v_tile + (jj + kPvPrefetchKeys) * ldv, L * sizeof(T));
      }
    };
    size_t c = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // L = 64 on AVX-512: all four vectors of columns in one pass over the
    // keys (16 accumulators), each key's four weights broadcast once, not
    // once per pair of vectors.  H=8 Hkv=2 decode, one thread, alternated
    // runs on Zen 5: Skv=4096 62.4 -> 57.9 us (buffers 16 bytes off 67.9 ->
    // 60.6), Skv=2048 16 bytes off 44.9 -> 39.0 us.
    if (L == 4 * N) {
      using V = decltype(hn::Zero(d));
      V o00 = hn::Zero(d), o01 = o00, o02 = o00, o03 = o00, o10 = o00, o11 = o00, o12 = o00;
      V o13 = o00, o20 = o00, o21 = o00, o22 = o00, o23 = o00, o30 = o00, o31 = o00;
      V o32 = o00, o33 = o00;
      const T* HWY_RESTRICT v_j = v_tile;
      const float* HWY_RESTRICT p_j = s_keys;
      for (size_t jj = 0; jj < nj; ++jj, v_j += ldv, p_j += R) {
        prefetch_v(jj);
        const auto x0 = LoadF32(d, v_j), x1 = LoadF32(d, v_j + N);
        const auto x2 = LoadF32(d, v_j + 2 * N), x3 = LoadF32(d, v_j + 3 * N);
        const auto add = [&](float w, V& y0, V& y1, V& y2, V& y3) {
          const auto p = hn::Set(d, w);
          y0 = hn::MulAdd(p, x0, y0);
          y1 = hn::MulAdd(p, x1, y1);
          y2 = hn::MulAdd(p, x2, y2);
          y3 = hn::MulAdd(p, x3, y3);
        };
        add(p_j[0], o00, o01, o02, o03);
        add(p_j[1], o10, o11, o12, o13);
        add(p_j[2], o20, o21, o22, o23);
        add(p_j[3], o30, o31, o32, o33);
      }
      const auto put = [&](size_t r, V y0, V y1, V y2, V y3) {
        if (!use[r]) return;
        float* HWY_RESTRICT a_r = acc + r * L;
        const auto cr = hn::Set(d, corr[r]);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r), cr, y0), d, a_r);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + N), cr, y1), d, a_r + N);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + 2 * N), cr, y2), d, a_r + 2 * N);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + 3 * N), cr, y3), d, a_r + 3 * N);
      };
      put(0, o00, o01, o02, o03);
      put(1, o10, o11, o12, o13);
      put(2, o20, o21, o22, o23);
      put(3, o30, o31, o32, o33);
      c = L;
    }
#endif
    if (c < L) {
      // P V in blocks of kPvKeys keys: all column blocks of a key block
      // while its V rows are in L1, each column block's sums carried from
      // one key block to the next through o_tmp (the same sums in the same
      // order as one pass per column block over all the tile's keys, so the
      // same bits; that read each V row once per column block: at L = 128,
      // four passes over the tile's V, each a 64-byte line of every row).
      // With the V prefetch above, alternated with the one-pass-per-column-
      // block loop (which had it too) on the Sapphire Rapids VM, H=32 Hkv=8
      // L=128 Skv=32768 decode, medians of 5 calls, 3 rounds: bf16 K/V one
      // thread 39.8-41.3 -> 34.7-38.3 ms, two threads 17.2-22.6 -> 15.9-17.8
      // ms, f16 38.3-44.6 -> 35.1-37.0 ms, f32 47.9-56.6 -> 46.9-52.2 ms;
      // K/V in L2 (Skv=512) 223-234 -> 234-242 us (the o_tmp round trips).
      const auto block = [&](auto dc, size_t cc, size_t jb, size_t nb) {  // one vector or lane
        const bool first = jb == 0;
        const auto load = [&](size_t r) {
          return first ? hn::Zero(dc) : hn::LoadU(dc, o_tmp + r * L + cc);
        };
        auto o0 = load(0), o1 = load(1), o2 = load(2), o3 = load(3);
        const T* HWY_RESTRICT v_c = v_tile + jb * ldv + cc;
        const float* HWY_RESTRICT p_j = s_keys + jb * R;
        for (size_t jj = 0; jj < nb; ++jj, v_c += ldv, p_j += R) {
          if (cc == 0) prefetch_v(jb + jj);
          const auto x = LoadF32(dc, v_c);
          o0 = hn::MulAdd(hn::Set(dc, p_j[0]), x, o0);
          o1 = hn::MulAdd(hn::Set(dc, p_j[1]), x, o1);
          o2 = hn::MulAdd(hn::Set(dc, p_j[2]), x, o2);
          o3 = hn::MulAdd(hn::Set(dc, p_j[3]), x, o3);
        }
        hn::StoreU(o0, dc, o_tmp + cc);
        hn::StoreU(o1, dc, o_tmp + L + cc);
        hn::StoreU(o2, dc, o_tmp + 2 * L + cc);
        hn::StoreU(o3, dc, o_tmp + 3 * L + cc);
      };
      const hn::CappedTag<float, 1> d1;
      for (size_t jb = 0; jb < nj; jb += kPvKeys) {
        const size_t nb = nj - jb < kPvKeys ? nj - jb : kPvKeys;
        const bool first = jb == 0;
        using V = hn::Vec<decltype(d)>;
        size_t lines;  // from DRAM: the next block's V rows, spread over the block's calls
        auto next_v = NextPvBlock(a, v_tile, ldv, jb, nj, pv_passes, &lines);
        size_t credit = 0;
        const size_t calls = pv_passes * nb;
        const auto prefetch = [&](size_t) { SpreadLines<false>(next_v, credit, lines, calls); };
        size_t cc = c;
        while (cc + 2 * N <= lv) {  // each column's chain is the same in any pass width
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
          if (GroupPvVecs(cc, lv, N) == 3) {
            GroupPvBlock<3>(
                [&](const T* HWY_RESTRICT v, V& x0, V& x1, V& x2) {
                  x0 = LoadF32(d, v);
                  x1 = LoadF32(d, v + N);
                  x2 = LoadF32(d, v + 2 * N);
                },
                v_tile, ldv, s_keys, jb, nb, cc, L, first, lines != 0, prefetch, o_tmp);
            cc += 3 * N;
            continue;
          }
#endif
          GroupPvBlock<2>(
              [&](const T* HWY_RESTRICT v, V& x0, V& x1, V&) {
                x0 = LoadF32(d, v);
                x1 = LoadF32(d, v + N);
              },
              v_tile, ldv, s_keys, jb, nb, cc, L, first, lines != 0, prefetch, o_tmp);
          cc += 2 * N;
        }
        for (; cc + N <= lv; cc += N) block(d, cc, jb, nb);
        for (; cc < L; ++cc) block(d1, cc, jb, nb);
      }
      for (size_t r = 0; r < R; ++r) {  // acc = corr acc + P V
        if (!use[r]) continue;
        float* HWY_RESTRICT a_r = acc + r * L;
        const float* HWY_RESTRICT o_r = o_tmp + r * L;
        size_t cc = c;
        for (; cc + N <= lv; cc += N) {
          hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + cc), hn::Set(d, corr[r]), hn::LoadU(d, o_r + cc)),
                     d, a_r + cc);
        }
        for (; cc < L; ++cc) {
          hn::StoreU(hn::MulAdd(hn::LoadU(d1, a_r + cc), hn::Set(d1, corr[r]),
                                hn::LoadU(d1, o_r + cc)),
                     d1, a_r + cc);
        }
      }
    }
  }
}

// The grouped decode (FlashAttentionGroupByDot) for bf16 K and V with L a
// multiple of 2N: each 2N-element block of a K or V row is loaded as N u32
// lanes (LoadBf16Pair), its even elements the low halves shifted up, its odd
// ones the high halves masked: one integer op per vector of K or V where
// widening a vector alone takes two (zero-extend, shift).  The group's q
// rows are deinterleaved the same way once per call (qp), so that each
// score is the same dot product with its terms paired differently; P V sums
// each row's output deinterleaved too (o_tmp) and interleaves it back once
// per key tile, when it is added to acc.  Per key pair and 2N columns the
// scores take 16 FMAs + 4 integer ops instead of 16 + 8 (shift, widen), P V
// per key 8 FMAs + 2 instead of 8 + 4: the FMA ports' other work.  Measured
// on the Sapphire Rapids VM (H=32 Hkv=8 Skv=256, K/V in L2, one thread,
// medians of 2000 calls, 6 runs alternated with FlashAttentionGroupByDot):
// L=128 52.9-58.0 vs 58.9-85.1 us, L=64 39.1-39.9 vs 42.1-42.9 us.  Over a
// cache read from memory (Skv=32768) the two are alike (paired runs: ratio
// 1.00, quartiles 0.96-1.08): that step waits on memory, not on the ports.
inline bool GroupsBf16Pairs(size_t L) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  return HWY_TARGET != HWY_SCALAR && L % (2 * N) == 0;
}

HWY_NOINLINE void FlashAttentionGroupByDotBf16Pairs(
    const AttnDims& a, const float* HWY_RESTRICT q_blk, size_t ldq,
    const hwy::bfloat16_t* HWY_RESTRICT k_g, size_t ldk, const hwy::bfloat16_t* HWY_RESTRICT v_g,
    size_t ldv, size_t visible, size_t key_begin, size_t key_end, float* HWY_RESTRICT acc,
    float* m, float* l, float* bad, float* HWY_RESTRICT s_keys, float* HWY_RESTRICT o_tmp) {
  using T = hwy::bfloat16_t;
  constexpr size_t R = kGroupRows;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d), N2 = 2 * N;
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
  // o_tmp holds R rows of P V sums, then the R deinterleaved q rows.
  float* HWY_RESTRICT qp = o_tmp + R * L;
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < L; c += N2) {
      V even, odd;
      hn::LoadInterleaved2(d, q_blk + r * ldq + c, even, odd);
      hn::StoreU(even, d, qp + r * L + c);
      hn::StoreU(odd, d, qp + r * L + c + N);
    }
  }
  HWY_ALIGN float pair[2 * HWY_MAX_BYTES / sizeof(float)];
  // P V's passes over a block of keys, and the V rows the scores loop
  // prefetches, as in FlashAttentionGroupByDot.  A pass reads 2N bf16 of
  // each row: where that is at most half a line (AVX2, SSE4, NEON) a row
  // has no more lines (2L/64 + 1) than passes (L/2N), so the next block's
  // lines are at most its calls and SpreadLines issues one at most a call
  // (the form measured fastest on Zen 3).  Where a pass reads a whole line
  // (AVX-512: L = 128 is 4 passes and 4-5 lines a row) it must issue more:
  // with one at most, a fifth of each next block's lines (its last rows)
  // went unprefetched, and on a Zen 4 VM (H=32 Hkv=8 L=128 Skv=32768, one
  // thread, 3 alternated rounds) bf16 K/V took 10.9-12.4 ms (min of 10)
  // against 9.3-10.1 issuing them all (f16: 8.8-9.3).
  constexpr bool kPvOneLine = 2 * HWY_LANES(float) * sizeof(T) <= 32;
  size_t pv_passes = L / N2;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (L == 2 * N2) pv_passes = 0;  // one pass over all the keys
#endif
  const size_t v_keys = pv_passes == 0 ? kDotKeyTile : kPvKeys;
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    const T* HWY_RESTRICT k_tile = k_g + j0 * ldk;
    const T* HWY_RESTRICT v_tile = v_g + j0 * ldv;
    // From DRAM: the K rows kPrefetchKeys ahead of a key pair, and its V rows
    // below v_keys.
    const auto prefetch_pair = [&](size_t j) {
      if (a.prefetch_kv) PrefetchGroupKeys(k_tile, ldk, v_tile, ldv, j, 2, end - j0, L, v_keys);
    };
    size_t j = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // L = 64 on AVX-512: the rows' 16 deinterleaved q vectors stay in
    // registers, as in FlashAttentionGroupByDot.
    if (L == 2 * N2) {
      const auto qv = [&](size_t r, size_t c) { return hn::LoadU(d, qp + r * L + c * N); };
      const V q00 = qv(0, 0), q01 = qv(0, 1), q02 = qv(0, 2), q03 = qv(0, 3);
      const V q10 = qv(1, 0), q11 = qv(1, 1), q12 = qv(1, 2), q13 = qv(1, 3);
      const V q20 = qv(2, 0), q21 = qv(2, 1), q22 = qv(2, 2), q23 = qv(2, 3);
      const V q30 = qv(3, 0), q31 = qv(3, 1), q32 = qv(3, 2), q33 = qv(3, 3);
      for (; j + 2 <= nj; j += 2) {
        prefetch_pair(j);
        const T* HWY_RESTRICT k0 = k_tile + j * ldk;
        const T* HWY_RESTRICT k1 = k0 + ldk;
        V a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
        V a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        // One block of 2N columns: q's even and odd vectors of each row.
        const auto block = [&](size_t c, V e0r, V o0r, V e1r, V o1r, V e2r, V o2r, V e3r,
                               V o3r) {
          V e0, o0, e1, o1;
          LoadBf16Pair(d, k0 + c, e0, o0);
          LoadBf16Pair(d, k1 + c, e1, o1);
          a00 = hn::MulAdd(e0r, e0, a00);
          a10 = hn::MulAdd(e0r, e1, a10);
          a01 = hn::MulAdd(e1r, e0, a01);
          a11 = hn::MulAdd(e1r, e1, a11);
          a02 = hn::MulAdd(e2r, e0, a02);
          a12 = hn::MulAdd(e2r, e1, a12);
          a03 = hn::MulAdd(e3r, e0, a03);
          a13 = hn::MulAdd(e3r, e1, a13);
          a00 = hn::MulAdd(o0r, o0, a00);
          a10 = hn::MulAdd(o0r, o1, a10);
          a01 = hn::MulAdd(o1r, o0, a01);
          a11 = hn::MulAdd(o1r, o1, a11);
          a02 = hn::MulAdd(o2r, o0, a02);
          a12 = hn::MulAdd(o2r, o1, a12);
          a03 = hn::MulAdd(o3r, o0, a03);
          a13 = hn::MulAdd(o3r, o1, a13);
        };
        block(0, q00, q01, q10, q11, q20, q21, q30, q31);
        block(N2, q02, q03, q12, q13, q22, q23, q32, q33);
        HWY_ALIGN float s01[2 * R];
        StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s01);
        ScaleEight(s01, scale2, s_keys + j * R);
      }
    }
#endif
    for (; j + 2 <= nj; j += 2) {
      prefetch_pair(j);
      const T* HWY_RESTRICT k0 = k_tile + j * ldk;
      const T* HWY_RESTRICT k1 = k0 + ldk;
      V a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
      V a10 = a00, a11 = a00, a12 = a00, a13 = a00;
      for (size_t c = 0; c < L; c += N2) {
        V e0, o0, e1, o1;
        LoadBf16Pair(d, k0 + c, e0, o0);
        LoadBf16Pair(d, k1 + c, e1, o1);
        const float* HWY_RESTRICT qc = qp + c;
        const auto row = [&](size_t r, V& s0, V& s1) {
          auto qe = hn::LoadU(d, qc + r * L), qo = hn::LoadU(d, qc + r * L + N);
          KeepInRegister(qe);
          KeepInRegister(qo);
          s0 = hn::MulAdd(qe, e0, s0);
          s1 = hn::MulAdd(qe, e1, s1);
          s0 = hn::MulAdd(qo, o0, s0);
          s1 = hn::MulAdd(qo, o1, s1);
        };
        row(0, a00, a10);
        row(1, a01, a11);
        row(2, a02, a12);
        row(3, a03, a13);
      }
      HWY_ALIGN float s01[2 * R];
      StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s01);
      ScaleEight(s01, scale2, s_keys + j * R);
    }
    for (; j < nj; ++j) {
      PrefetchKvRow(v_tile + j * ldv, L * sizeof(T));
      for (size_t r = 0; r < R; ++r) {
        s_keys[j * R + r] = scale2 * Dot(q_blk + r * ldq, k_tile + j * ldk, L);
      }
    }
    float corr[R];
    bool use[R];
    if (!GroupTileSoftmax<R>(s_keys, nj, m, l, bad, corr, use)) continue;
    // o_tmp[r] = sum_j P[r][j] V[j], deinterleaved per 2N columns: in blocks
    // of kPvKeys keys (their V rows stay in L1), each block of 2N columns'
    // sums carried from one key block to the next through o_tmp.
    const auto prefetch_v = [&](size_t jj) {
      if (a.prefetch_kv && jj + kPvPrefetchKeys < nj) {
        PrefetchKvRow(v_tile + (jj + kPvPrefetchKeys) * ldv, L * sizeof(T));
      }
    };
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // L = 64 on AVX-512: all columns in one pass over the keys (16
    // accumulators), as in FlashAttentionGroupByDot.
    if (L == 2 * N2) {
      V o00 = hn::Zero(d), o01 = o00, o02 = o00, o03 = o00, o10 = o00, o11 = o00, o12 = o00;
      V o13 = o00, o20 = o00, o21 = o00, o22 = o00, o23 = o00, o30 = o00, o31 = o00;
      V o32 = o00, o33 = o00;
      const T* HWY_RESTRICT v_j = v_tile;
      const float* HWY_RESTRICT p_j = s_keys;
      for (size_t jj = 0; jj < nj; ++jj, v_j += ldv, p_j += R) {
        prefetch_v(jj);
        V x0, x1, x2, x3;
        LoadBf16Pair(d, v_j, x0, x1);
        LoadBf16Pair(d, v_j + N2, x2, x3);
        const auto add = [&](float w, V& y0, V& y1, V& y2, V& y3) {
          const auto p = hn::Set(d, w);
          y0 = hn::MulAdd(p, x0, y0);
          y1 = hn::MulAdd(p, x1, y1);
          y2 = hn::MulAdd(p, x2, y2);
          y3 = hn::MulAdd(p, x3, y3);
        };
        add(p_j[0], o00, o01, o02, o03);
        add(p_j[1], o10, o11, o12, o13);
        add(p_j[2], o20, o21, o22, o23);
        add(p_j[3], o30, o31, o32, o33);
      }
      const auto put = [&](size_t r, V e0, V od0, V e1, V od1) {
        if (!use[r]) return;
        float* HWY_RESTRICT a_r = acc + r * L;
        const auto cr = hn::Set(d, corr[r]);
        hn::StoreInterleaved2(e0, od0, d, pair);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r), cr, hn::Load(d, pair)), d, a_r);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + N), cr, hn::Load(d, pair + N)), d, a_r + N);
        hn::StoreInterleaved2(e1, od1, d, pair);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + N2), cr, hn::Load(d, pair)), d, a_r + N2);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + N2 + N), cr, hn::Load(d, pair + N)), d,
                   a_r + N2 + N);
      };
      put(0, o00, o01, o02, o03);
      put(1, o10, o11, o12, o13);
      put(2, o20, o21, o22, o23);
      put(3, o30, o31, o32, o33);
      continue;
    }
#endif
    for (size_t jb = 0; jb < nj; jb += kPvKeys) {
      const size_t nb = nj - jb < kPvKeys ? nj - jb : kPvKeys;
      const bool first = jb == 0;
      size_t lines;  // from DRAM: the next block's V rows, spread over the block's calls
      auto next_v = NextPvBlock(a, v_tile, ldv, jb, nj, pv_passes, &lines);
      size_t credit = 0;
      const size_t calls = pv_passes * nb;
      const auto prefetch = [&](size_t) { SpreadLines<kPvOneLine>(next_v, credit, lines, calls); };
      for (size_t cc = 0; cc < L; cc += N2) {
        GroupPvBlock<2>(
            [&](const T* HWY_RESTRICT v, V& x0, V& x1, V&) { LoadBf16Pair(d, v, x0, x1); },
            v_tile, ldv, s_keys, jb, nb, cc, L, first, lines != 0, prefetch, o_tmp);
      }
    }
    for (size_t r = 0; r < R; ++r) {  // acc = corr acc + P V, back in column order
      if (!use[r]) continue;
      float* HWY_RESTRICT a_r = acc + r * L;
      const float* HWY_RESTRICT o_r = o_tmp + r * L;
      const auto cr = hn::Set(d, corr[r]);
      for (size_t cc = 0; cc < L; cc += N2) {
        hn::StoreInterleaved2(hn::LoadU(d, o_r + cc), hn::LoadU(d, o_r + cc + N), d, pair);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + cc), cr, hn::Load(d, pair)), d, a_r + cc);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + cc + N), cr, hn::Load(d, pair + N)), d,
                   a_r + cc + N);
      }
    }
  }
}

// FlashAttentionGroupByDot for K and V of their views' dtypes (a mixed pair
// widened tile by tile, as RowByDot does).
inline void GroupByDot(const AttnDims& a, const float* HWY_RESTRICT q_blk, size_t ldq,
                       const KvRows& k_g, const KvRows& v_g, size_t visible, size_t key_begin,
                       size_t key_end, float* HWY_RESTRICT acc, float* m, float* l, float* bad,
                       float* HWY_RESTRICT s_rows, float* HWY_RESTRICT o_tmp) {
  if (k_g.dtype == v_g.dtype) {
    if (k_g.dtype == DType::kBF16 && GroupsBf16Pairs(a.head_dim)) {
      FlashAttentionGroupByDotBf16Pairs(
          a, q_blk, ldq, reinterpret_cast<const hwy::bfloat16_t*>(k_g.base), k_g.stride,
          reinterpret_cast<const hwy::bfloat16_t*>(v_g.base), v_g.stride, visible, key_begin,
          key_end, acc, m, l, bad, s_rows, o_tmp);
      return;
    }
    WithElementType(k_g.dtype, k_g.base, [&](const auto* k) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
      const T* v = reinterpret_cast<const T*>(v_g.base);
      FlashAttentionGroupByDot(a, q_blk, ldq, k, k_g.stride, v, v_g.stride, visible, key_begin,
                               key_end, acc, m, l, bad, s_rows, o_tmp);
    });
    return;
  }
  const size_t L = a.head_dim, end = visible < key_end ? visible : key_end;
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    size_t ldk, ldv;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    FlashAttentionGroupByDot(a, q_blk, ldq, k_tile, ldk, v_tile, ldv, nj, 0, nj, acc, m, l, bad,
                             s_rows, o_tmp);
  }
}

// Query rows [i0, i0 + rows) over keys [key_begin, key_end) when they are
// too few to fill the lanes (grouped query heads of a decode step, a short
// prefill): the keys run along the lanes instead.  Per key tile, K^T is
// packed with the scale folded in, S = Q K^T comes out row-major, the online
// softmax runs along each row, and P V is the register-tiled product that
// reads each value row once per tile for all the rows.  Rows of S are
// kKeyTile apart, in s_t.
inline void FlashAttentionRowsByKeys(const AttnDims& a, const float* HWY_RESTRICT q_blk,
                                     size_t ldq, const KvRows& k_g, const KvRows& v_g,
                                     size_t i0, size_t rows,
                                     size_t key_begin, size_t key_end, const FlashScratch& f) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, ld = kKeyTile;
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  const float scale2 = Base2Scale(a);
  const size_t last_visible = a.visible_keys(i0 + rows - 1);
  const size_t keys_needed = last_visible < key_end ? last_visible : key_end;
  size_t keys[kQueryBlock];
  // The first tile writes acc (no scaling of zeros by corr = 0, no fill).
  bool first = true;
  for (size_t j0 = key_begin; j0 < keys_needed; j0 += kKeyTile) {
    const size_t nj = keys_needed - j0 < kKeyTile ? keys_needed - j0 : kKeyTile;
    const size_t cols = RoundUpToVectors(nj, N);  // whole vectors; K^T is zero past nj
    if (j0 + nj < keys_needed) {
      const size_t next = HWY_MIN(kKeyTile, keys_needed - j0 - nj);
      k_g.PrefetchTile(j0 + nj, next, L);
      v_g.PrefetchTile(j0 + nj, next, L);
    }
    size_t ldk;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    TransposeScaledPadded(k_tile, nj, L, ldk, scale2, f.k_t, ld, cols);
    // S[r][j] = (scale log2(e) K[j0 + j]) . Q[i0 + r]
    MatMul(rows, cols, L, q_blk, ldq, f.k_t, ld, [&](auto d, size_t r, size_t c, auto acc) {
      hn::StoreU(acc, d, f.s_t + r * ld + c);
    });
    for (size_t r = 0; r < rows; ++r) {
      const size_t visible = a.visible_keys(i0 + r);
      keys[r] = visible <= j0 ? 0 : (visible - j0 < nj ? visible - j0 : nj);
      float* HWY_RESTRICT s_r = f.s_t + r * ld;
      const float tile_max = RowMax(s_r, keys[r]);  // -inf for no key
      if (!(tile_max < -kNegInf)) f.bad[r] = 1.0f;   // NaN or +inf
      const float m_new = HWY_MAX(f.m[r], tile_max);
      // Rows that have seen nothing finite shift by 0: 2^(-inf - 0) = 0.
      const float shift = m_new == kNegInf ? 0.0f : m_new;
      const float corr = f.m[r] == kNegInf ? 0.0f : std::exp2(f.m[r] - shift);
      const float sum = ExpShiftedRow</*kBase2=*/true>(s_r, keys[r], shift, s_r);
      f.l[r] = f.l[r] * corr + sum;
      f.m[r] = m_new;
      if (!first && corr != 1.0f) ScaleRow(f.acc + r * L, L, corr);
    }
    // acc[r] (+)= sum_{j < keys[r]} P[r][j] V[j0 + j]
    size_t ldv;
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    WeightedSumRagged(rows, L, f.s_t, ld, 1, keys, v_tile, ldv, f.acc, L,
                      /*accumulate=*/!first);
    first = false;
  }
  if (first) Fill(f.acc, rows * L, 0.0f);
}

// Query rows [i0, i1) of head (b, h), i1 - i0 <= kQueryBlock, over keys
// [key_begin, key_end).  With partial == nullptr the rows are final and go
// to out; otherwise each row's (acc[L], m, l) goes to partial[r] for
// MergeKeySplits.
inline void FlashAttentionRows(const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                               size_t i0, size_t i1, size_t key_begin, size_t key_end,
                               float* HWY_RESTRICT partial, float* HWY_RESTRICT scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim, rows = i1 - i0;
  const size_t g = h / a.group();
  const FlashScratch f = CarveFlashScratch(a, views, scratch);
  // Q rows in place (f32) or widened (16-bit); K and V tile by tile.
  const TensorView& vq = views.q;
  const float* HWY_RESTRICT q_blk;
  size_t ldq;
  if (vq.IsF32() && !(rows <= 4 * kGroupRows && QCopied(vq.Row(b, h, i0), vq.ss))) {
    q_blk = reinterpret_cast<const float*>(vq.Row(b, h, i0));
    ldq = vq.ss;
  } else {
    WidenRows(vq.Row(b, h, i0), vq.dtype, vq.ss, rows, L, f.q_rows, L);
    q_blk = f.q_rows;
    ldq = L;
  }
  const KvRows k_g{views.k.Row(b, g, 0), views.k.dtype, views.k.ss, f.k_rows};
  const KvRows v_g{views.v.Row(b, g, 0), views.v.dtype, views.v.ss, f.v_rows};
  const OutRows o_blk{views.out.Row(b, h, i0), views.out.dtype, views.out.ss};
  const size_t ldw = f.ldw, cols = QueryColumns(rows);

  Fill(f.m, cols, kNegInf);
  Fill(f.l, cols, 0.0f);
  Fill(f.bad, cols, 0.0f);

  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());
  // Rows that all see the same keys (a grouped decode step) and are few:
  // kGroupRows at a time on dot products, K and V read once per group, the
  // rest (up to 3) one at a time.  Not on SCALAR: there GCC 12 vectorizes the
  // one-lane P V loop over a key's four contiguous weights into loads of two
  // neighbouring V elements, the second past the end of the last V row
  // (tests/guard_pages_test.cc); its rows take the paths below.
  if (HWY_TARGET != HWY_SCALAR && rows > kDotRows &&
      (rows <= 4 * kGroupRows || GroupsShortBlock(rows, key_end - key_begin, lanes)) &&
      a.visible_keys(i0) == a.visible_keys(i1 - 1)) {
    Fill(f.acc, rows * L, 0.0f);
    const size_t visible = a.visible_keys(i0);
    size_t r = 0;
    for (; r + kGroupRows <= rows; r += kGroupRows) {
      GroupByDot(a, q_blk + r * ldq, ldq, k_g, v_g, visible, key_begin, key_end,
                 f.acc + r * L, f.m + r, f.l + r, f.bad + r, f.s_t, f.k_t);
    }
    for (; r < rows; ++r) {
      RowByDot(a, q_blk + r * ldq, k_g, v_g, visible, key_begin, key_end, f.acc + r * L,
               f.m + r, f.l + r, f.bad + r, f.s_row);
    }
    FinishRows(rows, L, f.acc, f.m, f.l, f.bad, o_blk, partial);
    return;
  }
  // Keys in the lanes where a block of query lanes would be half padding;
  // below 4 rows the K^T packing costs more than the dot products it saves.
  if (rows > kDotRows && 2 * rows <= lanes) {
    FlashAttentionRowsByKeys(a, q_blk, ldq, k_g, v_g, i0, rows, key_begin, key_end, f);
    FinishRows(rows, L, f.acc, f.m, f.l, f.bad, o_blk, partial);
    return;
  }
  if (rows <= kDotRows) {
    Fill(f.acc, rows * L, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      RowByDot(a, q_blk + r * ldq, k_g, v_g, a.visible_keys(i0 + r), key_begin,
                             key_end, f.acc + r * L, f.m + r, f.l + r, f.bad + r, f.s_row);
    }
    FinishRows(rows, L, f.acc, f.m, f.l, f.bad, o_blk, partial);
    return;
  }

  // q_t[l][r] = scale log2(e) Q[i0 + r][l]; padding columns stay 0 (finite
  // scores in lanes no row reads).
  // (4 x 4 blocks in registers: element by element this was 14% of an
  // S=20 call on AVX2.)
  const float scale2 = Base2Scale(a);
  TransposeScaledPadded(q_blk, rows, L, ldq, scale2, f.q_t, ldw, cols);

  const size_t last_visible = a.visible_keys(i1 - 1);
  const size_t keys_needed = last_visible < key_end ? last_visible : key_end;
  size_t keys[kQueryBlock];
  // The first tile writes acc: no fill, and no scaling of zeros by its
  // corrections (2^-inf = 0): 4% of an S=20 call.
  bool first = true;
  for (size_t j0 = key_begin; j0 < keys_needed; j0 += kKeyTile) {
    const size_t nj = keys_needed - j0 < kKeyTile ? keys_needed - j0 : kKeyTile;
    if (j0 + nj < keys_needed) {
      const size_t next = HWY_MIN(kKeyTile, keys_needed - j0 - nj);
      k_g.PrefetchTile(j0 + nj, next, L);
      v_g.PrefetchTile(j0 + nj, next, L);
    }
    // S^T[j][r] = K[j0 + j] . (scale log2(e) Q[i0 + r])
    size_t ldk;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const auto store_s = [&](auto d, size_t j, size_t c, auto acc) {
      hn::StoreU(acc, d, f.s_t + j * ldw + c);
    };
    // Three vectors of query lanes (17-24 rows on AVX2, the seed's 20): 4 x 3
    // tiles, 3 loads and 4 broadcasts per 12 FMAs, instead of a 6 x 2 tile
    // and a 6 x 1 one (7 loads per 6 FMAs).  Not compiled for SCALAR's
    // one-vector tiles.
    bool tiled_4x3 = false;
    if constexpr (kTileVecs == 2) {
      if (cols == 3 * lanes) {
        MatMul<4, 3>(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
        tiled_4x3 = true;
      }
    }
    // AVX-512 (32 registers): 6 x 4 tiles, the 64 query lanes of a full
    // block at once, 10 loads per 24 FMAs instead of 8 per 12; the same
    // bits (each score is one FMA chain whatever the tile).  Paired runs
    // alternated with 6 x 2 on the Sapphire Rapids VM (B=1 H=8 L=64, 10-20
    // rounds, medians of the per-round ratios): S=512 one thread 0.955x the
    // time, S=2048 0.971x, S=2048 two threads 0.950x.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (!tiled_4x3) MatMul<kTileRows, 4>(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
#else
    if (!tiled_4x3) MatMul(nj, cols, L, k_tile, ldk, f.q_t, ldw, store_s);
#endif
    // Keys of this tile each row sees; on the causal diagonal the rest are -inf.
    for (size_t r = 0; r < rows; ++r) {
      const size_t visible = a.visible_keys(i0 + r);
      keys[r] = visible <= j0 ? 0 : (visible - j0 < nj ? visible - j0 : nj);
      for (size_t j = keys[r]; j < nj; ++j) f.s_t[j * ldw + r] = kNegInf;
    }

    // Online softmax down the keys, all query rows at once along the lanes.
    const hn::ScalableTag<float> d;
    const size_t N = hn::Lanes(d);
    const auto neg_inf = hn::Set(d, kNegInf), pos_inf = hn::Set(d, -kNegInf);
    // Four keys per step, each with its own max, flag and sum: the chains
    // of Max and Add would otherwise bound the loops by their latency.
    for (size_t c = 0; c < cols; c += N) {
      const float* HWY_RESTRICT s_c = f.s_t + c;
      const auto m_old = hn::LoadU(d, f.m + c);
      auto max0 = neg_inf, max1 = neg_inf, max2 = neg_inf, max3 = neg_inf;
      // Lanes whose row has seen no NaN or +inf: one chain of And (latency
      // 1) is enough.  With four, as the maxima have, GCC spilled two of
      // them on AVX2 and the loop ran at the store-to-load latency.
      auto ok = hn::Eq(hn::LoadU(d, f.bad + c), hn::Zero(d));
      const auto see = [&](auto& max, size_t j) {
        const auto s = hn::LoadU(d, s_c + j * ldw);
        max = hn::Max(max, s);
        ok = hn::And(ok, hn::Lt(s, pos_inf));
      };
      size_t j = 0;
      for (; j + 4 <= nj; j += 4) {
        see(max0, j);
        see(max1, j + 1);
        see(max2, j + 2);
        see(max3, j + 3);
      }
      for (; j < nj; ++j) see(max0, j);
      const auto tile_max = hn::Max(hn::Max(max0, max1), hn::Max(max2, max3));
      const auto bad = hn::Not(ok);
      const auto m_new = hn::Max(m_old, tile_max);
      // Rows that have seen nothing finite shift by 0: exp(-inf - 0) = 0.
      const auto shift = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      const auto corr = Exp2NonPositive(d, hn::Sub(m_old, shift));
      auto sum0 = hn::Zero(d), sum1 = hn::Zero(d), sum2 = hn::Zero(d), sum3 = hn::Zero(d);
      const auto weigh = [&](auto& sum, size_t j) {
        float* HWY_RESTRICT p = f.s_t + j * ldw + c;
        const auto e = Exp2NonPositive(d, hn::Sub(hn::LoadU(d, p), shift));
        hn::StoreU(e, d, p);
        sum = hn::Add(sum, e);
      };
      for (j = 0; j + 4 <= nj; j += 4) {
        weigh(sum0, j);
        weigh(sum1, j + 1);
        weigh(sum2, j + 2);
        weigh(sum3, j + 3);
      }
      for (; j < nj; ++j) weigh(sum0, j);
      const auto sum = hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3));
      hn::StoreU(m_new, d, f.m + c);
      hn::StoreU(hn::MulAdd(hn::LoadU(d, f.l + c), corr, sum), d, f.l + c);
      hn::StoreU(corr, d, f.corr + c);
      hn::StoreU(hn::IfThenElseZero(bad, hn::Set(d, 1.0f)), d, f.bad + c);
    }
    for (size_t r = 0; r < rows && !first; ++r) {
      if (f.corr[r] != 1.0f) ScaleRow(f.acc + r * L, L, f.corr[r]);
    }
    // acc[r] (+)= sum_{j < keys[r]} P^T[j][r] V[j0 + j]
    size_t ldv;
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    WeightedSumRagged(rows, L, f.s_t, 1, ldw, keys, v_tile, ldv, f.acc, L,
                      /*accumulate=*/!first);
    first = false;
  }
  if (first) Fill(f.acc, rows * L, 0.0f);
  FinishRows(rows, L, f.acc, f.m, f.l, f.bad, o_blk, partial);
}

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
inline bool PacksKvRows(const TensorView& t, size_t L) { return t.ss != L || !t.IsF32(); }

// Floats of the copies of one kv head's strided or 16-bit K and V rows (0: no copy).
// Only where a head has more than one query block to reuse them.
inline size_t HeadPackFloats(const AttnDims& a, const AttnViews& v) {
  const size_t L = a.head_dim;
  if (a.seq_q <= kQueryBlock) return 0;
  const size_t per = RoundUpFloats(a.seq_kv * L);
  const size_t floats = (PacksKvRows(v.k, L) ? per : 0) + (PacksKvRows(v.v, L) ? per : 0);
  return floats != 0 && floats <= kHeadPackMaxFloats ? floats : 0;
}

// Scratch of FlashAttentionRowsHeadPacked.
inline size_t HeadPackedScratch(const AttnDims& a, const AttnViews& v) {
  return RoundUpFloats(AttentionScratch(a, v)) + kHeadPackTagFloats + HeadPackFloats(a, v);
}

// Rows [0, n) of t's head (b, g) as contiguous f32 rows of L at dst; the
// rows ahead prefetched (strided rows do not start the stream prefetcher).
inline void PackHeadRows(const TensorView& t, size_t b, size_t g, size_t n, size_t L,
                         float* HWY_RESTRICT dst) {
  constexpr size_t kAhead = 8;
  const size_t row_bytes = L * DTypeBytes(t.dtype);
  for (size_t s = 0; s < n; ++s) {
    if (s + kAhead < n) PrefetchBytes(t.Row(b, g, s + kAhead), row_bytes);
    ConvertRow(t.Row(b, g, s), t.dtype, L, dst + s * L, DType::kF32);
  }
}

// FlashAttentionRows over all keys of rows [i0, i1) of head (b, h), the
// strided K/V rows of its kv head read from this thread's copy (made here
// if the copy holds another head, or is from another call: `call` is
// unique per call).
inline void FlashAttentionRowsHeadPacked(const AttnDims& a, const AttnViews& views, size_t b,
                                         size_t h, size_t i0, size_t i1, uint64_t call,
                                         float* HWY_RESTRICT scratch) {
  const size_t L = a.head_dim, g = h / a.group();
  float* const tag_at = scratch + RoundUpFloats(AttentionScratch(a, views));
  float* pack = tag_at + kHeadPackTagFloats;
  const uint64_t tag[3] = {call, b, g};
  AttnViews packed = views;
  const auto use = [&](TensorView& t) {
    if (!PacksKvRows(t, L)) return static_cast<float*>(nullptr);
    float* rows = pack;
    pack += RoundUpFloats(a.seq_kv * L);
    t.data = rows;
    t.dtype = DType::kF32;
    t.sb = t.sh = 0;
    t.ss = L;
    return rows;
  };
  float* const k_rows = use(packed.k);
  float* const v_rows = use(packed.v);
  if (memcmp(tag_at, tag, sizeof(tag)) != 0) {
    if (k_rows) PackHeadRows(views.k, b, g, a.seq_kv, L, k_rows);
    if (v_rows) PackHeadRows(views.v, b, g, a.seq_kv, L, v_rows);
    memcpy(tag_at, tag, sizeof(tag));
  }
  FlashAttentionRows(a, packed, b, h, i0, i1, 0, a.seq_kv, nullptr, scratch);
}

// Combines the partials of `splits` key ranges (in their order, so the result
// does not depend on which thread ran which range) into one row:
//   M = max_c m_c,  O = sum_c 2^(m_c - M) acc_c / sum_c 2^(m_c - M) l_c
// (m in base 2, as the kernels carry the scores).  rec: the row's record of
// the first split, the next split's `split_stride` floats further.  A NaN m
// marks a NaN row.
inline void MergeKeySplitsRow(size_t L, const float* HWY_RESTRICT rec0, size_t split_stride,
                              size_t splits, float* HWY_RESTRICT o_r) {
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
  float l_all = 0.0f;
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
    MergeKeySplitsRow(L, partials + r * stride, rows * stride, splits, o_r);
    if (!out.IsF32()) StoreRow(o_r, L, out.Row(b, h, i0 + r), out.dtype);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_INL_H_
