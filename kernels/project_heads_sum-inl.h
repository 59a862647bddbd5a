// project_heads_sum: Y = sum_h g_h O_h Wo[h] + bias, reading O head-major
// ([B][H][S][L]) with no concatenated copy.  Wo[h] is rows h*L .. h*L+L-1 of
// Wo [H*L][D].  Also the per-head views that the explicit sum makes cheap:
// each head's contribution O_h Wo[h], its norm, and its attribution onto
// directions.
//   einsum 'bhsl,hld->bsd'

#if defined(HEADSUM_KERNELS_PROJECT_HEADS_SUM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_PROJECT_HEADS_SUM_INL_H_
#undef HEADSUM_KERNELS_PROJECT_HEADS_SUM_INL_H_
#else
#define HEADSUM_KERNELS_PROJECT_HEADS_SUM_INL_H_
#endif

#include <stddef.h>

#include <cmath>
#include <cstdint>

#include "kernels/convert-inl.h"
#include "kernels/matmul-inl.h"
#include "kernels/shapes.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {
// The chained sum's register tile.  AVX2 (16 registers): 6 x 2, 2 loads of B
// and 6 broadcasts per 12 FMAs; a 48-column panel is three of its column
// tiles.  Formerly 4 x 3 (3 + 4), chosen on Zen 1 (one
// core, H*L = D = 512: S=512 7.6 against 7.8-8.0 ms, S=20 300 against 309-327
// us): it loads B, a panel of 96 KiB streamed from L2 once per row tile, 1.5
// times as often per FMA, and on the Zen 3 VM that costs more than the
// broadcasts (one core, alternated, medians: S=20 145 -> 133 us, 151 -> 142
// with buffers 16 bytes off; S=128 816 -> 725, 853 -> 765; two cores S=128
// 461 -> 410).  Three or four rows in place keep 4 x 3 (ChainTileT).
#if HWY_TARGET == HWY_AVX2
constexpr size_t kChainTileRows = 6, kChainTileVecs = 2;
#else
constexpr size_t kChainTileRows = kWideRows, kChainTileVecs = kWideVecs;
#endif


// Rows [s0, s1) and columns [c0, c1) of Y (and of every head's contribution)
// for batch b.  Heads are added in order 0..H-1 onto the bias: the sum does
// not depend on how the caller splits rows and columns.
inline void SumHeadsTile(const ProjDims& p, const ProjectArgs& args, size_t b, size_t s0,
                         size_t s1, size_t c0, size_t c1) {
  const size_t S = p.seq, H = p.heads, L = p.head_dim, D = p.model_dim;
  const size_t rows = s1 - s0, cols = c1 - c0;
  float* HWY_RESTRICT y = args.y ? args.y + (b * S + s0) * D + c0 : nullptr;
  if (y) {
    for (size_t r = 0; r < rows; ++r) {
      if (args.bias) {
        const float* HWY_RESTRICT bias = args.bias + c0;
        float* HWY_RESTRICT y_r = y + r * D;
        ForEachVector(cols, [&](auto d, size_t c) {
          hn::StoreU(hn::LoadU(d, bias + c), d, y_r + c);
        });
      } else {
        Fill(y + r * D, cols, 0.0f);
      }
    }
  }
  for (size_t h = 0; h < H; ++h) {
    const float gate = args.head_gates ? args.head_gates[h] : 1.0f;
    float* HWY_RESTRICT contribution =
        args.per_head ? args.per_head + ((b * S + s0) * H + h) * D + c0 : nullptr;
    const bool adds_to_y = y != nullptr && gate != 0.0f;
    if (!adds_to_y && contribution == nullptr) continue;  // a gated-off head is free
    const float* HWY_RESTRICT o_h = args.heads + ((b * H + h) * S + s0) * L;
    const float* HWY_RESTRICT wo_h = args.wo + h * L * D + c0;
    // Y[s][c] += g_h * sum_l O_h[s][l] Wo[h][l][c]
    MatMul<kWideRows, kWideVecs>(rows, cols, L, o_h, L, wo_h, D,
                                 [&](auto d, size_t r, size_t c, auto acc) {
      if (contribution) hn::StoreU(acc, d, contribution + r * H * D + c);
      if (adds_to_y) {
        float* HWY_RESTRICT dst = y + r * D + c;
        hn::StoreU(hn::MulAdd(hn::Set(d, gate), acc, hn::LoadU(d, dst)), d, dst);
      }
    });
  }
}

// A block of O packed for the chained sum (PackRowsOfO): the block's rows in
// the row tiles that ChainTile runs (ForEachRowTile<kChainTileRows>), each
// tile in quads of four rows, each quad [H*L][4]: element (k, row) of the
// quad at k * 4 + row, k = h * L + l.  The tile's broadcasts of A then read
// one or two contiguous streams, 16 bytes a step, where O in place has the
// tile's rows 8 streams apart (in L1 with the B panel's lines that stream
// through it).  A tile takes kPackedTileRows rows of space.
constexpr size_t kPackedTileRows = (kChainTileRows + 3) / 4 * 4;

// Floats of a packed block of `rows` rows of O.
inline size_t PackedOFloats(const ProjDims& p, size_t rows) {
  return (rows + kChainTileRows - 1) / kChainTileRows * kPackedTileRows * p.inner();
}

template <class T>
HWY_INLINE void PackRowsOfOT(const ProjDims& p, const TensorView& heads, size_t b, size_t s0,
                             size_t s1, float* HWY_RESTRICT dst) {
  const size_t L = p.head_dim, inner = p.inner();
  // Head by head: the block's rows of one head are adjacent in a head-major
  // O (and rows of a token-major O are read in order), so the reads form one
  // forward stream per head.
  for (size_t h = 0; h < p.heads; ++h) {
    ForEachRowTile<kChainTileRows>(s1 - s0, [&](size_t t, size_t r0, size_t height) {
      for (size_t q = 0; 4 * q < height; ++q) {
        const size_t first = s0 + r0 + 4 * q, last = s0 + r0 + HWY_MIN(4 * q + 4, height) - 1;
        const T* HWY_RESTRICT rows[4];
        for (size_t i = 0; i < 4; ++i) {
          rows[i] = reinterpret_cast<const T*>(heads.Row(b, h, HWY_MIN(first + i, last)));
        }
        float* HWY_RESTRICT quad = dst + (t * kPackedTileRows + 4 * q) * inner + h * L * 4;
        ForEachVector(L, [&](auto d, size_t l) {
          hn::StoreInterleaved4(LoadF32(d, rows[0] + l), LoadF32(d, rows[1] + l),
                                LoadF32(d, rows[2] + l), LoadF32(d, rows[3] + l), d,
                                quad + 4 * l);
        });
      }
    });
  }
}

// Rows [s0, s1) of batch b of O (any dtype, widened exactly) into dst in the
// packed layout above.  A quad with fewer than four rows repeats its last
// one (those lanes are never read).
inline void PackRowsOfO(const ProjDims& p, const TensorView& heads, size_t b, size_t s0,
                        size_t s1, float* HWY_RESTRICT dst) {
  WithElementType(heads.dtype, heads.data, [&](const auto* o) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(o)>>;
    PackRowsOfOT<T>(p, heads, b, s0, s1, dst);
  });
}

// Rows of Wo ahead that a one- or two-row tile prefetches, every line of
// its columns.  Far enough to cover a read from memory (on Zen 5 the first
// line of the row 8 ahead alone lost a third to every line 32 ahead, Wo
// from memory), near enough that the rows in flight do not overflow the
// L1 sets they map to: a row stride of R bytes puts the same columns of
// rows 4096/R apart in the same sets (all rows, for R a multiple of 4 KiB),
// and 12 ways hold 12 such rows with nothing else there.  With 32 rows
// ahead the prefetched lines evicted each other before they were read:
// measured on the Sapphire Rapids VM (H*L = D = 512, one thread, Wo in
// L2, medians of 5 rounds), f32 Wo (2 KiB rows) 17.1 us at 32 rows ahead,
// 14.7 at 12, 11.1 at 8 and 4; bf16 12.7 at 32, 11.2 at 12, 9.6 at 8; from
// memory 32 and 8 alike (f32 94.5 vs 78.5 us, bf16 50.3 vs 50.4).  So about
// 16 KiB of rows ahead (at most 4 of the 12 ways of a set taken by rows in
// flight), clamped to 4-32 rows.
inline size_t FewRowsPrefetch(size_t row_bytes) {
  const size_t rows = row_bytes == 0 ? 32 : (size_t{16} << 10) / row_bytes;
  return rows < 4 ? 4 : (rows > 32 ? 32 : rows);
}

// Floats of scratch ChainTile needs: a 16-bit O's rows widened ([H][rows][L])
// and a 16-bit Y tile before its rounding ([rows][cols]: up to kChainRows
// rows of one panel, or one or two rows of up to all D columns).
inline size_t ChainScratch(const ProjDims& p, DType o, DType y) {
  return (o == DType::kF32 ? 0 : p.heads * kChainRows * p.head_dim) +
         (y == DType::kF32 ? 0 : HWY_MAX(kChainRows * kWoPanelCols, 2 * p.model_dim)) +
         p.model_dim + 16;  // a one-row sweep's partial sums, on a 64-byte boundary
}

// How far ahead RowSweep prefetches Wo: about 16 KiB of the rows it reads.
// (On the Zen 3 VM, AVX2, a bf16 Wo from
// memory one row a pass: 31.2 us one row ahead, 32.4 two, 33.9 sixteen, 37.2
// with none; f32 in cache 20.0 one row ahead against 24.7 at eight.  Kept at
// 16 KiB for the Zen 4 figures in PrefetchIntoL2's note, where nothing
// shorter was measured.)
constexpr size_t kSweepAheadBytes = size_t{16} << 10;

// The sweeps' (RowSweep's) steps.  Two vectors of a Wo
// row at p: a bf16 pair's even and odd elements (kLoadsBf16Pairs), else
// two consecutive vectors widened.
template <class D, class TB>
HWY_INLINE void SweepLoad2(D d, const TB* HWY_RESTRICT p, hn::Vec<D>& x0, hn::Vec<D>& x1) {
  if constexpr (kLoadsBf16Pairs<TB>) {
    LoadBf16Pair(d, p, x0, x1);
  } else {
    x0 = LoadF32(d, p);
    x1 = LoadF32(d, p + hn::Lanes(d));
  }
}

// The partial sums y[0, cols) start at init (or 0), deinterleaved in pairs
// of vectors (even, odd elements) when kPairs.
template <bool kPairs, class D>
HWY_INLINE void SweepStart(D d, const float* HWY_RESTRICT init, size_t cols,
                           float* HWY_RESTRICT y) {
  const size_t N = hn::Lanes(d);
  for (size_t c = 0; c < cols; c += 2 * N) {
    hn::Vec<D> y0 = hn::Zero(d), y1 = hn::Zero(d);
    if (init != nullptr) {
      if constexpr (kPairs) {
        hn::LoadInterleaved2(d, init + c, y0, y1);
      } else {
        y0 = hn::LoadU(d, init + c);
        y1 = hn::LoadU(d, init + c + N);
      }
    }
    hn::StoreU(y0, d, y + c);
    hn::StoreU(y1, d, y + c + N);
  }
}

// The finished sums to out (Y's row), re-interleaved when kPairs.
template <bool kPairs, class D>
HWY_INLINE void SweepFinish(D d, const float* HWY_RESTRICT y, size_t cols, float* HWY_RESTRICT out) {
  const size_t N = hn::Lanes(d);
  for (size_t c = 0; c < cols; c += 2 * N) {
    const hn::Vec<D> e = hn::LoadU(d, y + c), o = hn::LoadU(d, y + c + N);
    if constexpr (kPairs) {
      hn::StoreInterleaved2(e, o, d, out + c);
    } else {
      hn::StoreU(e, d, out + c);
      hn::StoreU(o, d, out + c + N);
    }
  }
}

// One row of Y (a decode step), columns [0, cols) with cols a multiple of
// 2N, in Wo's own order: y[c] = init[c] + sum_{s, l} a[s*a_step + l] *
// b[s*b_step + l*ldb + c], the terms added in the order of s, then l, each
// element one FMA chain (the bits of MicroTile's, so of every other row
// count and blocking).  The partial sums live in y (f32, cols floats, the
// caller's scratch on a 64-byte boundary) between passes, and go to out
// (Y's row, anywhere) at the end; a pass takes kSweepRows rows of Wo across all the
// columns, so Wo is read in address order, each byte once (MatMul's column
// tiles sweep all of Wo's rows per 1-2 lines of each, 1-2 KiB apart, which
// the hardware prefetchers do not follow).  The rows `ahead` rows on are
// prefetched line by line during a pass (0: none).  bf16 rows are read as
// pairs (LoadBf16Pair), the sums kept deinterleaved in y until the end.
// kSweepRows = 1 reads one stream, which the hardware prefetchers follow
// best, and loads and stores y once per row; 4 rows side by side load and
// store it a quarter as often but read four streams 1-2 KiB apart.
// Measured on an AMD EPYC (Zen 3) VM, H*L = D = 512, medians of 5, two
// rounds: Wo from memory,
// one thread, bf16 MatMul 50.5-58.7 us, 4 rows 39.0-44.9, 1 row 32.3-35.1;
// f32 MatMul 74-86, 4 rows 60-68, 1 row 66.9-68.6; Wo in cache, bf16
// MatMul 12.5-14.6, 4 rows 11.8-12.7, 1 row 17.1 (f32 4 rows 17.7-21.0,
// 1 row 22.6) (one round each; the kept choice against MatMul, paired:
// from memory bf16 55 -> 34 us, f32 79-81 -> 60; in cache bf16 13-14 ->
// 17.5-18.6, f32 20 -> 16).  (Tried before: one row for a 16-bit Wo
// split by columns across threads, blocks of 8 rows with the sums in
// registers where one thread read whole rows, four rows for f32, every
// prefetch into L1.)  On a Zen 4 VM (a
// decode step's threads each read whole rows of their heads, dispatch/
// projection.cc's DecodeByHeadGroups; the rows ahead asked into L2,
// PrefetchIntoL2; H*L = D = 512, medians of 21 x 200-2000 calls, three
// alternated rounds, buffers 16 bytes off): a 16-bit Wo two rows a pass
// (bf16 from memory one thread 34-42 us, two 20-25; in cache 9.1-9.3 and
// 6.0-6.3) against one row (30-40, 18.5-23; 12.0-12.3, 7.6-7.8) and blocks
// of 8 (40-47, 22-29; 9.7-9.8, 6.4-7.0); f32 one row a pass (from memory
// 48-64 us, two threads 36-37; in cache 19.1, 10.4-10.5) against four
// (79-82, 43-45; 14.7-15.8, 8.2-8.8).  Each takes what wins by the most:
// two rows for 16-bit (25% in cache against 10% from memory), one for f32
// (1.3-1.6x from memory against 0.8x in cache).  A 16-bit Wo takes two rows only where the call before read the
// same Wo and it fits the L2s (ProjDims::wo_recent), one row otherwise: on
// the Zen 3 VM (AVX2; a ring of 1025 layers of bf16 Wo, H*L = D = 512,
// medians of 15 alternated rounds of 200-2000 calls in one process) one
// row a pass 29-35 us from memory against 43-48 for two (two threads
// 23-24 against 31-32), in cache 17-20 against 12.6-15 (two threads 15.0
// against 13.2); the Zen 4 figures above lean the same way.
template <size_t kSweepRows, class TB>
HWY_INLINE void RowSweep(size_t segments, size_t L, const float* HWY_RESTRICT a, size_t a_step,
                         const TB* HWY_RESTRICT b, size_t ldb, size_t b_step, size_t cols,
                         const float* HWY_RESTRICT init, size_t ahead, float* HWY_RESTRICT y,
                         float* HWY_RESTRICT out) {
  static_assert(1 <= kSweepRows && kSweepRows <= 4, "one to four rows a pass");
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  constexpr bool kPairs = kLoadsBf16Pairs<TB>;
  SweepStart<kPairs>(d, init, cols, y);
  const size_t row_bytes = cols * sizeof(TB);
  const size_t K = segments * L;
  for (size_t s = 0; s < segments; ++s) {
    const float* HWY_RESTRICT as = a + s * a_step;
    const TB* HWY_RESTRICT bs = b + s * b_step;
    size_t l = 0;
    for (; l + kSweepRows <= L; l += kSweepRows) {
      // The rows' weights in named registers (SVE vectors cannot be array
      // elements); rows past kSweepRows compile away.
      const V w0 = hn::Set(d, as[l]);
      const V w1 = hn::Set(d, as[l + (kSweepRows > 1 ? 1 : 0)]);
      const V w2 = hn::Set(d, as[l + (kSweepRows > 2 ? 2 : 0)]);
      const V w3 = hn::Set(d, as[l + (kSweepRows > 3 ? 3 : 0)]);
      const TB* HWY_RESTRICT r[kSweepRows];
      const char* pf[kSweepRows];
      const size_t k = s * L + l;  // rows are b_step = L * ldb apart across segments
      const bool prefetching = ahead != 0 && k + ahead + kSweepRows <= K;
      HWY_UNROLL(8)
      for (size_t i = 0; i < kSweepRows; ++i) {
        r[i] = bs + (l + i) * ldb;
        pf[i] = reinterpret_cast<const char*>(r[i] + ahead * ldb);
        if (prefetching) PrefetchIntoL2(pf[i] + row_bytes - 1);
      }
      for (size_t c = 0; c < cols; c += 2 * N) {
        if (prefetching && (c * sizeof(TB)) % 64 == 0) {
          HWY_UNROLL(8)
          for (size_t i = 0; i < kSweepRows; ++i) PrefetchIntoL2(pf[i] + c * sizeof(TB));
        }
        V y0 = hn::LoadU(d, y + c), y1 = hn::LoadU(d, y + c + N);
        const auto add = [&](const TB* HWY_RESTRICT row, V wi, V& acc0, V& acc1) {
          V x0, x1;
          SweepLoad2(d, row + c, x0, x1);
          acc0 = hn::MulAdd(wi, x0, acc0);
          acc1 = hn::MulAdd(wi, x1, acc1);
        };
        add(r[0], w0, y0, y1);
        if constexpr (kSweepRows > 1) add(r[1], w1, y0, y1);
        if constexpr (kSweepRows > 2) add(r[2], w2, y0, y1);
        if constexpr (kSweepRows > 3) add(r[3], w3, y0, y1);
        hn::StoreU(y0, d, y + c);
        hn::StoreU(y1, d, y + c + N);
      }
    }
    for (; l < L; ++l) {
      const V w = hn::Set(d, as[l]);
      const TB* HWY_RESTRICT r = bs + l * ldb;
      for (size_t c = 0; c < cols; c += 2 * N) {
        V x0, x1;
        SweepLoad2(d, r + c, x0, x1);
        hn::StoreU(hn::MulAdd(w, x0, hn::LoadU(d, y + c)), d, y + c);
        hn::StoreU(hn::MulAdd(w, x1, hn::LoadU(d, y + c + N)), d, y + c + N);
      }
    }
  }
  SweepFinish<kPairs>(d, y, cols, out);
}

// Rows [s0, s1) (at most kChainRows) and columns [c0, c1) of Y when every
// gate is 1 and no per-head output is asked for:
//   Y[s][c] = bias[c] + sum_h sum_l O_h[s][l] Wo[h*L + l][c]
// one FMA chain per element over h, then l, its accumulator in a register
// across all the heads: concat-then-GEMM's arithmetic, without the
// concatenated copy and without a pass over Y per head.  wo_c0 points at
// column c0 of Wo with row stride ldw: Wo itself (ldw = its row stride) or
// one packed panel (ldw = the panel's width, c1 - c0 within it); a 16-bit Wo
// is widened in registers as it is loaded.  O and Y are views (any dtype):
// f32 O is read in place, 16-bit O widened into scratch; a 16-bit Y tile is
// computed in f32 and rounded once.  pack_into
// (when not null): Wo's columns [c0, c1) are also copied, as
// f32 rows of c1 - c0 floats, into that panel by the first row tile, which
// reads Wo in place (a bf16 Wo in column order there, not as pairs:
// MicroTile); the other row tiles read the panel (MatMulPackingB), and so
// can the caller's next tiles of rows.  (Formerly a bf16
// panel was widened in a pass of its own first: a third of an S=20
// projection's time with Wo in L2, perf on the Sapphire Rapids VM; paired,
// S=20 one thread 95.7 -> 72.3 us, two 55.4 -> 44.3, Wo from memory 120.4
// -> 111.6 and 76.2 -> 68.9.)
template <class TB>
HWY_INLINE void ChainTileT(const ProjDims& p, const TensorView& heads,
                           const TB* HWY_RESTRICT wo_c0, size_t ldw,
                           const float* HWY_RESTRICT bias, const TensorView& y, size_t b,
                           size_t s0, size_t s1, size_t c0, size_t c1,
                           float* HWY_RESTRICT scratch, float* HWY_RESTRICT pack_into) {
  const size_t H = p.heads, L = p.head_dim, rows = s1 - s0, cols = c1 - c0;
  const float* HWY_RESTRICT o = nullptr;
  size_t lda = 0, a_step = 0;
  if (heads.IsF32()) {
    o = reinterpret_cast<const float*>(heads.Row(b, 0, s0));  // O[b][0][s0]
    lda = heads.ss;
    a_step = heads.sh;  // O[b][h] -> O[b][h+1]
  } else {
    for (size_t h = 0; h < H; ++h) {
      WidenRows(heads.Row(b, h, s0), heads.dtype, heads.ss, rows, L, scratch + h * rows * L, L);
    }
    o = scratch;
    lda = L;
    a_step = rows * L;
    scratch += H * kChainRows * L;
  }
  float* HWY_RESTRICT y_tile;
  size_t ldy;
  if (y.IsF32()) {
    y_tile = reinterpret_cast<float*>(y.Row(b, 0, s0)) + c0;
    ldy = y.ss;
  } else {
    y_tile = scratch;
    ldy = cols;
    scratch += HWY_MAX(kChainRows * kWoPanelCols, 2 * p.model_dim);
  }
  // scratch now: model_dim + 16 floats for a one-row sweep's partial sums.
  KSegments every_head;
  every_head.segments = H;
  every_head.a_step = a_step;
  every_head.b_step = L * ldw;  // Wo[h] -> Wo[h+1]
  every_head.init = bias ? bias + c0 : nullptr;
  every_head.overlap_tail = true;  // `store` below: a column stored twice is the same bits
  const auto store = [&](auto d, size_t r, size_t c, auto acc) {
    hn::StoreU(acc, d, y_tile + r * ldy + c);
  };
  if (pack_into != nullptr) {
    KSegments packing = every_head;
    packing.pack = pack_into;
    packing.pack_ld = cols;
    MatMulPackingB<kChainTileRows, kChainTileVecs>(rows, cols, L, o, lda, wo_c0, ldw, store, packing);
  } else {
#if HWY_TARGET != HWY_SCALAR
    // One or two rows (a decode step): the wide tile would leave 2-3 FMA
    // chains in flight, a latency-bound quarter of the FMA rate; spread the
    // rows' panel over more vectors instead (1 x 6 or 2 x 4 chains; each
    // element is still one chain over h, then l, so the result is the same
    // bits).  Their B rows are each read once per column tile, a few lines
    // every 1-2 KiB, which starts no hardware stream: every line of the row
    // FewRowsPrefetch ahead is prefetched (a Wo from memory, H*L = D = 512,
    // Zen 5, one thread: bf16 37 -> 21-23 us, f32 48 -> 37-39 us, with the
    // wider column ranges of dispatch/projection.cc).
    every_head.prefetch_ahead = rows <= 2 ? FewRowsPrefetch(ldw * sizeof(TB)) : 0;
    if (rows == 1) {
      // A sweep for the columns in whole pairs of vectors, MatMul the rest.
      const size_t N2 = 2 * hn::Lanes(hn::ScalableTag<float>());
      const size_t cs = cols / N2 * N2;
      if (cs != 0) {
        const size_t sweep_bytes = cs * sizeof(TB);
        size_t ahead = kSweepAheadBytes / sweep_bytes;
        ahead = ahead < 4 ? 4 : (ahead > 64 ? 64 : ahead);
        // The partial sums in scratch on a 64-byte boundary, Y's row written
        // once at the end: Y's own row may start anywhere (16 bytes past a
        // boundary, a row a pass loads and stores lines split in two: two
        // threads, Wo in cache, bf16 13-14 us -> 26-32 on the Zen 3 VM).
        float* HWY_RESTRICT acc = reinterpret_cast<float*>(
            (reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
        if (sizeof(TB) == 2 && p.wo_recent) {  // two rows a pass
          RowSweep<2>(H, L, o, a_step, wo_c0, ldw, every_head.b_step, cs, every_head.init, ahead,
                      acc, y_tile);
        } else {  // f32, or a 16-bit Wo likely not in cache: one row a pass
          RowSweep<1>(H, L, o, a_step, wo_c0, ldw, every_head.b_step, cs, every_head.init, ahead,
                      acc, y_tile);
        }
      }
      if (cs < cols) {
        KSegments rest = every_head;
        if (rest.init != nullptr) rest.init += cs;
        const auto shifted = [&](auto d, size_t r, size_t c, auto acc) { store(d, r, cs + c, acc); };
        MatMul<1, 6>(rows, cols - cs, L, o, lda, wo_c0 + cs, ldw, shifted, rest);
      }
    } else if (rows == 2) {
      MatMul<2, 4>(rows, cols, L, o, lda, wo_c0, ldw, store, every_head);
#if HWY_TARGET == HWY_AVX2
    } else if (rows <= 4) {
      // 9 or 12 chains, where 6 x 2 would leave 6 or 8 (Zen 3 VM, one core,
      // buffers 16 bytes off: S=3 35 against 40 us, S=4 38 against 41).
      MatMul<4, 3>(rows, cols, L, o, lda, wo_c0, ldw, store, every_head);
#endif
    } else
#endif
    {
      MatMul<kChainTileRows, kChainTileVecs>(rows, cols, L, o, lda, wo_c0, ldw, store,
                                             every_head);
    }
  }
  if (!y.IsF32()) {
    const size_t bytes = DTypeBytes(y.dtype);
    for (size_t r = 0; r < rows; ++r) {
      StoreRow(y_tile + r * ldy, cols, y.Row(b, 0, s0 + r) + c0 * bytes, y.dtype);
    }
  }
}

// ChainTileT for Wo of dtype wo_dtype at wo_c0 (element c0 of its first row).
inline void ChainTile(const ProjDims& p, const TensorView& heads, const void* wo_c0,
                      DType wo_dtype, size_t ldw, const float* HWY_RESTRICT bias,
                      const TensorView& y, size_t b, size_t s0, size_t s1, size_t c0,
                      size_t c1, float* HWY_RESTRICT scratch, float* HWY_RESTRICT pack_into) {
  WithElementType(wo_dtype, wo_c0, [&](const auto* wo) {
    ChainTileT(p, heads, wo, ldw, bias, y, b, s0, s1, c0, c1, scratch, pack_into);
  });
}

// Y's rows [s0, s1) of batch b and columns [c0, c1), every gate 1, from
// rows [s0, s1) of O packed by PackRowsOfO (o_packed) and one Wo panel
// (columns [c0, c1), row stride ldw = c1 - c0: the plain call's f32 copy or
// headsum_wo_pack's panel of any dtype): the chained sum of ChainTileT, K
// (H*L, the heads one after another: packed O and a packed panel are both
// contiguous along it) in blocks of kc rows of the panel, each block run
// over every row tile before the next: a block of the panel (kc x the
// panel's width) stays in L1 while the tiles stream the packed rows of O
// from L2, where a whole panel (96 KiB at H*L = 512) would be read from L2
// once per row tile.  Between blocks each element's partial sum waits in
// f32 scratch ([rows][cols], scratch on a 64-byte boundary), stored and
// loaded exactly: the same FMA chain as one pass, so the same bits
// whatever kc; Y's rows are written once at the end (a 16-bit Y rounded
// once).  (Partial sums in an f32 Y itself, 16 bytes off a boundary, ran as
// fast: S = 512 3140-3152 against 3116-3149 us, S = 2048 12.55-12.76 ms
// against 12.65-12.70.)  (Zen 3 VM, one
// core, H*L = D = 512, S = 512, a standalone copy of the loop nest with O
// packed: blocks of 80-128 rows of the panel 0.90-0.92x the time of whole
// panels, 256 rows 0.95x.)
template <class TB>
HWY_INLINE void ChainBlockT(const ProjDims& p, const float* HWY_RESTRICT o_packed,
                            const TB* HWY_RESTRICT panel, size_t ldw,
                            const float* HWY_RESTRICT bias, const TensorView& y, size_t b,
                            size_t s0, size_t s1, size_t c0, size_t c1, size_t kc,
                            float* HWY_RESTRICT scratch) {
  const size_t inner = p.inner(), rows = s1 - s0, cols = c1 - c0;
  float* HWY_RESTRICT y_tile = scratch;  // [rows][cols], rows * kWoPanelCols floats
  const size_t ldy = cols;
  kc = HWY_MAX(kc, size_t{1});
  for (size_t k0 = 0; k0 < inner; k0 += kc) {
    const size_t k1 = HWY_MIN(k0 + kc, inner);
    // PackRowsOfO's row tiles, each quad [H*L][4]: row r of a tile at
    // (r % 4) + (r / 4) * 4 * H * L, step 4 along k.
    ForEachRowTile<kChainTileRows>(rows, [&](size_t t, size_t r0, size_t height) {
      KSegments block;
      block.a_quad = 4 * inner;
      if (k0 == 0) {
        block.init = bias ? bias + c0 : nullptr;
      } else {
        block.init_rows = y_tile + r0 * ldy;
        block.init_ld = ldy;
      }
      const auto store = [&](auto d, size_t r, size_t c, auto acc) {
        hn::StoreU(acc, d, y_tile + (r0 + r) * ldy + c);
      };
      RowTile<kChainTileRows, kChainTileVecs, false>(
          height, cols, k1 - k0, o_packed + t * kPackedTileRows * inner + 4 * k0, 1, 4,
          panel + k0 * ldw, ldw, store, block);
    });
  }
  const size_t bytes = DTypeBytes(y.dtype);
  for (size_t r = 0; r < rows; ++r) {
    StoreRow(y_tile + r * ldy, cols, y.Row(b, 0, s0 + r) + c0 * bytes, y.dtype);
  }
}

inline void ChainBlock(const ProjDims& p, const float* HWY_RESTRICT o_packed, const void* panel,
                       DType wo_dtype, size_t ldw, const float* HWY_RESTRICT bias,
                       const TensorView& y, size_t b, size_t s0, size_t s1, size_t c0, size_t c1,
                       size_t kc, float* HWY_RESTRICT scratch) {
  WithElementType(wo_dtype, panel, [&](const auto* wo) {
    ChainBlockT(p, o_packed, wo, ldw, bias, y, b, s0, s1, c0, c1, kc, scratch);
  });
}

// A decode step's projection split by groups of heads (dispatch/
// projection.cc, DecodeByHeadGroups): Y's row (n elements, dtype t, at
// out) is the groups' partial rows summed in group order, ((P_0 + P_1) +
// P_2) + ..., the partials `ldp` floats apart from part on (P_0 holding
// the bias), rounded once.  P_0 is overwritten with the sum.
inline void SumHeadGroups(float* HWY_RESTRICT part, size_t ldp, size_t groups, size_t n,
                          char* HWY_RESTRICT out, DType t) {
  ForEachVector(n, [&](auto d, size_t i) {
    auto sum = hn::LoadU(d, part + i);
    for (size_t g = 1; g < groups; ++g) sum = hn::Add(sum, hn::LoadU(d, part + g * ldp + i));
    hn::StoreU(sum, d, part + i);
  });
  StoreRow(part, n, out, t);
}

// Floats of one Wo panel widened to f32, [H*L][kWoPanelCols]: the plain
// call's copy of a panel per work item (dispatch/projection.cc says when).
inline size_t PanelFloats(const ProjDims& p) { return p.inner() * kWoPanelCols; }

// Rows of O per work item when O is packed (PackRowsOfO): a packed block
// of about a quarter of the L2 (l2_bytes), read from L2 by every block of
// every Wo panel (ChainBlockT); each panel is read once per block (from L3
// or memory).  At least 48 rows, so that a large H*L (a block of 48 rows
// then outgrows the L2 and streams from L3) still does 24 FMAs per Wo
// element read from memory; at most 192; and at most what gives each of
// `threads` threads two blocks of the sequence (rows of one sequence, a
// batch's sequences are blocks of their own).
inline size_t PackedRowBlock(const ProjDims& p, size_t l2_bytes, size_t threads) {
  size_t rows = l2_bytes / 4 / (p.inner() * sizeof(float));
  const size_t per_sequence = (2 * threads + p.batch - 1) / p.batch;
  rows = HWY_MIN(rows, (p.seq + per_sequence - 1) / per_sequence);
  rows = HWY_MIN(HWY_MAX(rows, size_t{48}), size_t{192});
  return (rows + kChainTileRows - 1) / kChainTileRows * kChainTileRows;
}

// Rows [k0, k1) of Wo (dtype t, row stride ldw elements) into dst, the
// whole Wo in headsum_wo_pack's panel layout in f32 (panel j, of width w,
// at dst + j * kWoPanelCols * H*L, its row k at + k * w): the copy that the
// plain call makes before its rows run (dispatch/projection.cc says when).
// Rows of Wo in place are D floats apart, so a row tile's loads of B fall
// into a few L1 sets (2 KiB apart at D = 512) and come from L2; a panel's
// rows are adjacent.  Each Wo row is read once, in order, and split among
// the panels.  Widening is exact: the same bits as reading a 16-bit Wo in
// place.
template <class T>
HWY_INLINE void PackWoRowsF32T(const ProjDims& p, const T* HWY_RESTRICT wo, size_t ldw,
                               size_t k0, size_t k1, float* HWY_RESTRICT dst) {
  const size_t D = p.model_dim, inner = p.inner();
  for (size_t k = k0; k < k1; ++k) {
    const T* HWY_RESTRICT row = wo + k * ldw;
    for (size_t c0 = 0; c0 < D; c0 += kWoPanelCols) {
      const size_t width = HWY_MIN(kWoPanelCols, D - c0);
      float* HWY_RESTRICT out = dst + c0 * inner + k * width;
      ForEachVector(width, [&](auto d, size_t i) { hn::StoreU(LoadF32(d, row + c0 + i), d, out + i); });
    }
  }
}

inline void PackWoRowsF32(const ProjDims& p, const void* wo, DType t, size_t ldw, size_t k0,
                          size_t k1, float* HWY_RESTRICT dst) {
  WithElementType(t, wo, [&](const auto* w) { PackWoRowsF32T(p, w, ldw, k0, k1, dst); });
}

// Floats of scratch ContributionNormsRows needs: one tile of contributions.
inline size_t NormsScratch(const ProjDims& p) { return kTileRows * p.model_dim; }

// out[b][s][h] = || O_h[s] Wo[h] ||_2 for rows [s0, s1): each contribution
// tile lives only in scratch, never in [B][S][H][D].
inline void ContributionNormsRows(const ProjDims& p, const float* HWY_RESTRICT heads,
                                  const float* HWY_RESTRICT wo, float* HWY_RESTRICT out,
                                  size_t b, size_t s0, size_t s1,
                                  float* HWY_RESTRICT scratch) {
  const size_t S = p.seq, H = p.heads, L = p.head_dim, D = p.model_dim;
  for (size_t r0 = s0; r0 < s1; r0 += kTileRows) {
    const size_t rows = s1 - r0 < kTileRows ? s1 - r0 : kTileRows;
    for (size_t h = 0; h < H; ++h) {
      const float* HWY_RESTRICT o_h = heads + ((b * H + h) * S + r0) * L;
      MatMul(rows, D, L, o_h, L, wo + h * L * D, D, [&](auto d, size_t r, size_t c, auto acc) {
        hn::StoreU(acc, d, scratch + r * D + c);
      });
      for (size_t r = 0; r < rows; ++r) {
        out[(b * S + r0 + r) * H + h] = Norm2(scratch + r * D, D);
      }
    }
  }
}

// wd[h][r][l] = Wo[h*L + l] . directions[r]: each head's output weights
// projected onto the directions, laid out [H][R][L] so that each (h, r) is
// one contiguous L-vector.  Rows k = h*L + l in [k0, k1) of Wo.
inline void ProjectWeightsOntoDirections(const ProjDims& p, const float* HWY_RESTRICT wo,
                                         const float* HWY_RESTRICT directions, size_t R,
                                         float* HWY_RESTRICT wd, size_t k0, size_t k1) {
  const size_t D = p.model_dim, L = p.head_dim;
  for (size_t k = k0; k < k1; ++k) {
    const size_t h = k / L, l = k % L;
    for (size_t r = 0; r < R; ++r) {
      wd[(h * R + r) * L + l] = Dot(wo + k * D, directions + r * D, D);
    }
  }
}

// out[b][s][h][r] = O_h[s] . wd[h][r]  ==  (O_h[s] Wo[h]) . directions[r],
// for rows [s0, s1) of batch b: O(L R) per (s, h) instead of O(L D + D R).
inline void AttributionRows(const ProjDims& p, const float* HWY_RESTRICT heads,
                            const float* HWY_RESTRICT wd, size_t R, float* HWY_RESTRICT out,
                            size_t b, size_t s0, size_t s1) {
  const size_t S = p.seq, H = p.heads, L = p.head_dim;
  for (size_t s = s0; s < s1; ++s) {
    for (size_t h = 0; h < H; ++h) {
      const float* HWY_RESTRICT o = heads + ((b * H + h) * S + s) * L;
      float* HWY_RESTRICT out_sh = out + ((b * S + s) * H + h) * R;
      for (size_t r = 0; r < R; ++r) out_sh[r] = Dot(o, wd + (h * R + r) * L, L);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_PROJECT_HEADS_SUM_INL_H_
