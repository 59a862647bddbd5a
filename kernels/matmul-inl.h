// Register-blocked matrix multiply, the core that every headsum kernel is
// built on:  C[r][c] = sum_k A[r][k] B[k][c]  for a small block of C, handed
// to an epilogue that decides what C is (scores, attention output, a head's
// contribution to Y...).  Compiled once per Highway target.

#if defined(HEADSUM_KERNELS_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_MATMUL_INL_H_
#undef HEADSUM_KERNELS_MATMUL_INL_H_
#else
#define HEADSUM_KERNELS_MATMUL_INL_H_
#endif

#include <stddef.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows x vectors of C held in registers at once: 6 x 2 = 12 independent
// accumulators (2 FMA ports x 4 cycles latency need >= 8 in flight), 2 loads
// of B and 6 broadcasts of A per 12 FMAs; fits 16 vector registers.
// The SCALAR fallback takes one column at a time: GCC 12's auto-vectorizer
// turns its two neighbouring 1-lane loads of B into a wider load that reads
// past the last row of B (found by tests/guard_pages_test.cc).
#if HWY_TARGET == HWY_SCALAR
constexpr size_t kTileRows = 6;
constexpr size_t kTileVecs = 1;
#else
constexpr size_t kTileRows = 6;
constexpr size_t kTileVecs = 2;
#endif
// A wider tile for long products with 32 vector registers (AVX-512, Arm):
// 8 x 3 = 24 accumulators, 3 loads of B and 8 broadcasts per 24 FMAs.  The
// projection gains from it (K = L per head, whole Y rows); the attention
// products, with their short K and per-tile epilogues, run on 6 x 2 (the
// scores of a query block on AVX-512: 6 x 4, AttentionTilesBlock).
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_ARCH_ARM_A64
constexpr size_t kWideRows = 8;
constexpr size_t kWideVecs = 3;
#else
constexpr size_t kWideRows = kTileRows;
constexpr size_t kWideVecs = kTileVecs;
#endif
// The probability-weighted sum of values (P V, K = keys, L columns): 6 x 4
// on 32-register targets, so that at L = 64 on AVX-512 each value row is
// loaded once per 6 query rows (24 accumulators, 4 loads, 6 broadcasts).
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_ARCH_ARM_A64
constexpr size_t kPvVecs = 4;
#else
constexpr size_t kPvVecs = kTileVecs;
#endif

// K may be read in segments: the product over K runs `segments` times, the
// s-th time with A advanced by s * a_step and B by s * b_step, all into the
// same accumulators (one FMA chain of segments * K terms per element).  The
// projection uses it to sum every head's O_h Wo[h] in registers.
// init: the accumulators start at init[col + v*N] in every row (a bias), or
// at zero when init is null.
// pack: where a packing tile (kPackB) also stores each f32 vector of B it
// loads, row k of segment s at pack + (s * K + k) * pack_ld: B's columns
// copied into one contiguous panel as a side effect of the first pass over
// them, for the tiles after it to read (MatMulPackingB).
struct KSegments {
  size_t segments = 1;
  size_t a_step = 0, b_step = 0;
  const float* init = nullptr;
  float* pack = nullptr;
  size_t pack_ld = 0;
  // Rows of B ahead whose every line the one- and two-row tiles prefetch
  // (B streamed from memory, as a decode step reads Wo); 0: only the first
  // line of the row 8 ahead.
  size_t prefetch_ahead = 0;
  // A's rows in quads: row r at (r % 4) * lda + (r / 4) * a_quad (a block
  // of O packed four rows at a time, PackRowsOfO); 0: row r at r * lda.
  size_t a_quad = 0;
  // The columns past the last whole vector (cols >= N) as one more vector
  // ending at column cols - 1, which overlaps the one before it, instead of
  // lane by lane: for an epilogue that stores (the overlapped columns are
  // computed twice, the same bits each time: one FMA chain per element).
  // (A whole tile ending at cols - 1 instead of the narrower tiles was
  // slower: S=20 D=512 with Wo's panels peeled, 155.5 against 151.9 us.)
  bool overlap_tail = false;
  // Row r's accumulators start at init_rows[r * init_ld + col + v*N] (in
  // place of init): partial sums of an earlier pass over other rows of K
  // (f32 stores and loads are exact, so a product over K in blocks is the
  // same chain as one pass).  Not with overlap_tail: the overlapping vector
  // would start from columns this pass already stored.
  const float* init_rows = nullptr;
  size_t init_ld = 0;
};

// Makes the compiler hold these vectors in registers.  GCC otherwise folds a
// vector's load into each FMA that uses it: in the grouped scores' loop
// every Q vector was loaded twice (10 loads per 8 FMAs), and Zen 1 does one
// 256-bit load per cycle, so the loop waited on loads, not on the FMAs.
// (And a bf16 pair's load into both of its ops: LoadBf16Pair.)
// Asks for the line at p into L2 (and not L1): prefetcht1 on x86, PLDL2KEEP
// on Arm.  For streams read from memory a few KiB ahead of their use: on a
// Zen 4 VM, a loop reading a bf16 Wo row by row (512 rows of 1 KiB, each
// loaded, widened and added into 2 KiB of f32 sums kept in L1) took 34 us
// from memory with no software prefetch, 34-40 prefetching 4-64 KiB ahead
// into L1 (prefetcht0), 21-24 prefetching 16-64 KiB ahead into L2 (t1 or
// t2): the rate of loads alone.
HWY_INLINE void PrefetchIntoL2(const void* p) { __builtin_prefetch(p, 0, 2); }

template <class V>
HWY_INLINE void KeepInRegister(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
  auto raw = v.raw;  // a local: clang cannot tie a member reached through a reference
  __asm__("" : "+v"(raw));  // any of the 32 registers
  v.raw = raw;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3 && (defined(__GNUC__) || defined(__clang__))
  auto raw = v.raw;
  __asm__("" : "+x"(raw));
  v.raw = raw;
#else
  (void)v;
#endif
}

// bf16 B two vectors at a time: the 2N bf16 at p read as N u32 lanes, each
// holding an (even, odd) column pair; the even columns are the low halves
// shifted up, the odd ones the high halves masked: one integer op per vector
// of B, where widening a vector alone takes two (zero-extend, shift).  The
// accumulators then hold the pair's columns deinterleaved (even, odd), and
// the tile interleaves them back once, after the whole product.
template <class TB>
constexpr bool kLoadsBf16Pairs =
    std::is_same<TB, hwy::bfloat16_t>::value && HWY_TARGET != HWY_SCALAR;

template <class D, class V>
HWY_INLINE void LoadBf16Pair(D d, const hwy::bfloat16_t* HWY_RESTRICT p, V& even, V& odd) {
  const hn::RebindToUnsigned<D> du;
  auto pairs = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  KeepInRegister(pairs);  // one load, not one folded into each of the two ops
  even = hn::BitCast(d, hn::ShiftLeft<16>(pairs));
  odd = hn::BitCast(d, hn::And(pairs, hn::Set(du, 0xFFFF0000u)));
}

// The C block of kRows x kVecs vectors at B's column `col`:
//   acc[r][v] = init + sum_{s, k < K} A[s*a_step + r*lda + k*ka] * B[s*b_step + k*ldb + col + v*N]
// (ka = 1 for a row-major A; ka > 1 reads A transposed, e.g. P^T).
// then epilogue(d, r, col + v*N, acc[r][v]) for each of them.  Caller
// guarantees that B holds kVecs full vectors (of `d`) from `col` on.
template <size_t kRows, size_t kVecs, bool kPackB = false, class D, class TB, class Epilogue>
HWY_INLINE void MicroTile(D d, size_t K, const float* HWY_RESTRICT a, size_t lda,
                          size_t ka, const TB* HWY_RESTRICT b, size_t ldb, size_t col,
                          const Epilogue& epilogue, const KSegments& chain = KSegments()) {
  static_assert(1 <= kRows && kRows <= 8, "rows");
  static_assert(1 <= kVecs && kVecs <= 6, "vectors");
  static_assert(kVecs <= 4 || kRows <= 2, "more than 4 vectors only for 1 or 2 rows");
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  // Unused accumulators (rows >= kRows, vectors >= kVecs) compile away.
  V i0 = hn::Zero(d), i1 = hn::Zero(d), i2 = hn::Zero(d), i3 = hn::Zero(d);
  V i4 = hn::Zero(d), i5 = hn::Zero(d);
  // bf16 B: vectors (0, 1), (2, 3), (4, 5) as deinterleaved pairs, except
  // where the tile also packs B (kPackB): a packed panel holds B in column
  // order, so that tile widens each vector on its own (two ops, not one).
  constexpr bool kPairs = kLoadsBf16Pairs<TB> && !kPackB;
  constexpr bool kPair01 = kPairs && kVecs > 1;
  constexpr bool kPair23 = kPairs && kVecs > 3;
  constexpr bool kPair45 = kPairs && kVecs > 5;
  // The kVecs vectors of a row of starting sums at p, in the order the B
  // vectors come in (bf16 pairs deinterleaved): the bias (init, the same in
  // every row) and the per-row sums (init_rows) both load through here.
  const auto load_row = [&](const float* HWY_RESTRICT p, V& v0, V& v1, V& v2, V& v3, V& v4,
                            V& v5) {
    if constexpr (kPair01) {
      hn::LoadInterleaved2(d, p, v0, v1);
      if constexpr (kVecs == 3) v2 = hn::LoadU(d, p + 2 * N);
      if constexpr (kPair23) hn::LoadInterleaved2(d, p + 2 * N, v2, v3);
      if constexpr (kVecs == 5) v4 = hn::LoadU(d, p + 4 * N);
      if constexpr (kPair45) hn::LoadInterleaved2(d, p + 4 * N, v4, v5);
    } else {
      v0 = hn::LoadU(d, p);
      if constexpr (kVecs > 1) v1 = hn::LoadU(d, p + N);
      if constexpr (kVecs > 2) v2 = hn::LoadU(d, p + 2 * N);
      if constexpr (kVecs > 3) v3 = hn::LoadU(d, p + 3 * N);
      if constexpr (kVecs > 4) v4 = hn::LoadU(d, p + 4 * N);
      if constexpr (kVecs > 5) v5 = hn::LoadU(d, p + 5 * N);
    }
  };
  if (chain.init != nullptr) load_row(chain.init + col, i0, i1, i2, i3, i4, i5);
  // Vectors 4 and 5 exist only in rows 0 and 1 (the few-row tiles).
  V c00 = i0, c01 = i1, c02 = i2, c03 = i3, c04 = i4, c05 = i5;
  V c10 = i0, c11 = i1, c12 = i2, c13 = i3, c14 = i4, c15 = i5;
  V c20 = i0, c21 = i1, c22 = i2, c23 = i3;
  V c30 = i0, c31 = i1, c32 = i2, c33 = i3;
  V c40 = i0, c41 = i1, c42 = i2, c43 = i3;
  V c50 = i0, c51 = i1, c52 = i2, c53 = i3;
  V c60 = i0, c61 = i1, c62 = i2, c63 = i3;
  V c70 = i0, c71 = i1, c72 = i2, c73 = i3;
  if (chain.init_rows != nullptr) {
    const float* HWY_RESTRICT p = chain.init_rows + col;
    const size_t ld = chain.init_ld;
    V unused4 = i4, unused5 = i5;  // rows 2..7 have at most 4 vectors (static_assert above)
    if constexpr (kRows > 0) load_row(p, c00, c01, c02, c03, c04, c05);
    if constexpr (kRows > 1) load_row(p + ld, c10, c11, c12, c13, c14, c15);
#define HEADSUM_ROW_INIT(r) \
    if constexpr (kRows > r) \
      load_row(p + r * ld, c##r##0, c##r##1, c##r##2, c##r##3, unused4, unused5);
    HEADSUM_ROW_INIT(2)
    HEADSUM_ROW_INIT(3)
    HEADSUM_ROW_INIT(4)
    HEADSUM_ROW_INIT(5)
    HEADSUM_ROW_INIT(6)
    HEADSUM_ROW_INIT(7)
#undef HEADSUM_ROW_INIT
  }
  const size_t quad = chain.a_quad != 0 ? chain.a_quad : 4 * lda;
  for (size_t s = 0; s < chain.segments; ++s) {
    const TB* HWY_RESTRICT bk = b + s * chain.b_step + col;
    const float* HWY_RESTRICT ak = a + s * chain.a_step;
    float* HWY_RESTRICT pk = kPackB ? chain.pack + s * K * chain.pack_ld + col : nullptr;
    for (size_t k = 0; k < K; ++k, bk += ldb, ak += ka) {
      if constexpr (kRows <= 2 && !kPackB) {
        if (chain.prefetch_ahead != 0) {
          const char* ahead = reinterpret_cast<const char*>(bk + chain.prefetch_ahead * ldb);
          const size_t bytes = kVecs * N * sizeof(TB);
          for (size_t i = 0; i < bytes; i += 64) hwy::Prefetch(ahead + i);
          hwy::Prefetch(ahead + bytes - 1);
        } else {
          hwy::Prefetch(bk + 8 * ldb);
        }
      }
      if constexpr (kPackB) {
        hwy::Prefetch(bk + 8 * ldb);
        hwy::Prefetch(bk + 8 * ldb + kVecs * N - 1);
      }
      V b0, b1, b2, b3, b4, b5;
      if constexpr (kPair01) {
        LoadBf16Pair(d, bk, b0, b1);
        if constexpr (kVecs == 3) b2 = LoadF32(d, bk + 2 * N);
        if constexpr (kPair23) LoadBf16Pair(d, bk + 2 * N, b2, b3);
        if constexpr (kVecs == 5) b4 = LoadF32(d, bk + 4 * N);
        if constexpr (kPair45) LoadBf16Pair(d, bk + 4 * N, b4, b5);
      } else {
        b0 = LoadF32(d, bk);
        b1 = b2 = b3 = b4 = b5 = b0;
        if constexpr (kVecs > 1) b1 = LoadF32(d, bk + N);
        if constexpr (kVecs > 2) b2 = LoadF32(d, bk + 2 * N);
        if constexpr (kVecs > 3) b3 = LoadF32(d, bk + 3 * N);
        if constexpr (kVecs > 4) b4 = LoadF32(d, bk + 4 * N);
        if constexpr (kVecs > 5) b5 = LoadF32(d, bk + 5 * N);
      }
      if constexpr (kPackB) {
        hn::StoreU(b0, d, pk);
        if constexpr (kVecs > 1) hn::StoreU(b1, d, pk + N);
        if constexpr (kVecs > 2) hn::StoreU(b2, d, pk + 2 * N);
        if constexpr (kVecs > 3) hn::StoreU(b3, d, pk + 3 * N);
        if constexpr (kVecs > 4) hn::StoreU(b4, d, pk + 4 * N);
        if constexpr (kVecs > 5) hn::StoreU(b5, d, pk + 5 * N);
        pk += chain.pack_ld;
      }
#define HEADSUM_ROW_FMA(r)                                          \
  if constexpr (kRows > r) {                                        \
    const V ar = hn::Set(d, ak[(r % 4) * lda + (r / 4) * quad]);    \
    c##r##0 = hn::MulAdd(ar, b0, c##r##0);                          \
    if constexpr (kVecs > 1) c##r##1 = hn::MulAdd(ar, b1, c##r##1); \
    if constexpr (kVecs > 2) c##r##2 = hn::MulAdd(ar, b2, c##r##2); \
    if constexpr (kVecs > 3) c##r##3 = hn::MulAdd(ar, b3, c##r##3); \
  }
#define HEADSUM_ROW_FMA6(r)                                         \
  HEADSUM_ROW_FMA(r)                                                \
  if constexpr (kRows > r) {                                        \
    const V ar = hn::Set(d, ak[(r % 4) * lda + (r / 4) * quad]);    \
    if constexpr (kVecs > 4) c##r##4 = hn::MulAdd(ar, b4, c##r##4); \
    if constexpr (kVecs > 5) c##r##5 = hn::MulAdd(ar, b5, c##r##5); \
  }
      HEADSUM_ROW_FMA6(0)
      HEADSUM_ROW_FMA6(1)
      HEADSUM_ROW_FMA(2)
      HEADSUM_ROW_FMA(3)
      HEADSUM_ROW_FMA(4)
      HEADSUM_ROW_FMA(5)
      HEADSUM_ROW_FMA(6)
      HEADSUM_ROW_FMA(7)
#undef HEADSUM_ROW_FMA6
#undef HEADSUM_ROW_FMA
    }
  }
  if constexpr (kPair01) {
    // Back to column order: each deinterleaved pair interleaved in place.
    HWY_ALIGN float pair[2 * HWY_MAX_BYTES / sizeof(float)];
    const auto interleave = [&](V& even, V& odd) {
      hn::StoreInterleaved2(even, odd, d, pair);
      even = hn::Load(d, pair);
      odd = hn::Load(d, pair + N);
    };
#define HEADSUM_ROW_INTERLEAVE(r)                              \
  if constexpr (kRows > r) {                                   \
    interleave(c##r##0, c##r##1);                              \
    if constexpr (kPair23) interleave(c##r##2, c##r##3);       \
  }
    HEADSUM_ROW_INTERLEAVE(0)
    HEADSUM_ROW_INTERLEAVE(1)
    HEADSUM_ROW_INTERLEAVE(2)
    HEADSUM_ROW_INTERLEAVE(3)
    HEADSUM_ROW_INTERLEAVE(4)
    HEADSUM_ROW_INTERLEAVE(5)
    HEADSUM_ROW_INTERLEAVE(6)
    HEADSUM_ROW_INTERLEAVE(7)
#undef HEADSUM_ROW_INTERLEAVE
    if constexpr (kPair45) {
      interleave(c04, c05);
      if constexpr (kRows > 1) interleave(c14, c15);
    }
  }
#define HEADSUM_ROW_OUT(r)                                             \
  if constexpr (kRows > r) {                                           \
    epilogue(d, r, col, c##r##0);                                      \
    if constexpr (kVecs > 1) epilogue(d, r, col + N, c##r##1);         \
    if constexpr (kVecs > 2) epilogue(d, r, col + 2 * N, c##r##2);     \
    if constexpr (kVecs > 3) epilogue(d, r, col + 3 * N, c##r##3);     \
  }
#define HEADSUM_ROW_OUT6(r)                                            \
  HEADSUM_ROW_OUT(r)                                                   \
  if constexpr (kRows > r) {                                           \
    if constexpr (kVecs > 4) epilogue(d, r, col + 4 * N, c##r##4);     \
    if constexpr (kVecs > 5) epilogue(d, r, col + 5 * N, c##r##5);     \
  }
  HEADSUM_ROW_OUT6(0)
  HEADSUM_ROW_OUT6(1)
  HEADSUM_ROW_OUT(2)
  HEADSUM_ROW_OUT(3)
  HEADSUM_ROW_OUT(4)
  HEADSUM_ROW_OUT(5)
  HEADSUM_ROW_OUT(6)
  HEADSUM_ROW_OUT(7)
#undef HEADSUM_ROW_OUT6
#undef HEADSUM_ROW_OUT
}

// kRows rows of C, columns [0, cols): full tiles of kVecs vectors, then
// narrower ones down to one vector, then single lanes (Highway 1.0.3 has no
// LoadN, and MaskedLoad is a full load on SSE4, so the tail never touches
// memory past column cols-1).
template <size_t kRows, size_t kVecs, bool kPackB = false, class TB, class Epilogue>
HWY_INLINE void MatMulRows(size_t cols, size_t K, const float* HWY_RESTRICT a,
                           size_t lda, size_t ka, const TB* HWY_RESTRICT b, size_t ldb,
                           const Epilogue& epilogue, const KSegments& chain) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t col = 0;
  for (; col + kVecs * N <= cols; col += kVecs * N) {
    MicroTile<kRows, kVecs, kPackB>(d, K, a, lda, ka, b, ldb, col, epilogue, chain);
  }
  // Then one narrower tile of each width down to two vectors, as needed.
  const auto narrower = [&](auto width) {
    constexpr size_t kWidth = decltype(width)::value;
    if constexpr (kVecs > kWidth) {
      if (col + kWidth * N <= cols) {
        MicroTile<kRows, kWidth, kPackB>(d, K, a, lda, ka, b, ldb, col, epilogue, chain);
        col += kWidth * N;
      }
    }
  };
  narrower(std::integral_constant<size_t, 5>());
  narrower(std::integral_constant<size_t, 4>());
  narrower(std::integral_constant<size_t, 3>());
  narrower(std::integral_constant<size_t, 2>());
  for (; col + N <= cols; col += N) {
    MicroTile<kRows, 1, kPackB>(d, K, a, lda, ka, b, ldb, col, epilogue, chain);
  }
  if (chain.overlap_tail && col < cols && cols >= N) {
    MicroTile<kRows, 1, kPackB>(d, K, a, lda, ka, b, ldb, cols - N, epilogue, chain);
    return;
  }
  const hn::CappedTag<float, 1> d1;
  for (; col < cols; ++col) {
    MicroTile<kRows, 1, kPackB>(d1, K, a, lda, ka, b, ldb, col, epilogue, chain);
  }
}

// The tile of `height` rows (1..kR) at a: MatMulRows<height, kV, kPackB>.
template <size_t kR, size_t kV, bool kPackB, class TB, class Epilogue>
HWY_INLINE void RowTile(size_t height, size_t cols, size_t K, const float* HWY_RESTRICT a,
                        size_t lda, size_t ka, const TB* HWY_RESTRICT b, size_t ldb,
                        const Epilogue& epilogue, const KSegments& chain) {
  if (height == kR) {
    MatMulRows<kR, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain);
    return;
  }
  switch (height) {
    case 1: if constexpr (kR > 1) MatMulRows<1, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 2: if constexpr (kR > 2) MatMulRows<2, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 3: if constexpr (kR > 3) MatMulRows<3, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 4: if constexpr (kR > 4) MatMulRows<4, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 5: if constexpr (kR > 5) MatMulRows<5, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 6: if constexpr (kR > 6) MatMulRows<6, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    case 7: if constexpr (kR > 7) MatMulRows<7, kV, kPackB>(cols, K, a, lda, ka, b, ldb, epilogue, chain); break;
    default: break;
  }
}

// Rows [0, rows) in ceil(rows / kR) tiles as equal in height as they can be
// (20 rows on a 6-row tile as 5+5+5+5, not 6+6+6+2): a 1- or 2-row
// remainder tile has too few independent FMA chains to cover the FMA
// latency.  The loads of B are the same (one pass over B per tile), and so
// are the results.  tile(t, r0, height) runs the t-th, rows [r0, r0 + height).
template <size_t kR, class Tile>
HWY_INLINE void ForEachRowTile(size_t rows, const Tile& tile) {
  if (rows == 0) return;
  const size_t tiles = (rows + kR - 1) / kR;
  const size_t base = rows / tiles, taller = rows % tiles;  // the first `taller` get base + 1
  size_t r0 = 0;
  for (size_t t = 0; t < tiles; ++t) {
    const size_t height = base + (t < taller ? 1 : 0);
    tile(t, r0, height);
    r0 += height;
  }
}

// C = A B for A [rows][K] (row stride lda), B [K][cols] (row stride ldb;
// f32, or f16/bf16 widened exactly in registers as it is loaded);
// epilogue(d, row, col, acc) receives each vector (or single lane) of C.
// Every element of C is one FMA chain over k in order 0..K-1, whatever tile
// computed it: results do not depend on how callers split rows or columns.
// kR x kV: the register tile (kTileRows x kTileVecs or kWideRows x kWideVecs).
template <size_t kR = kTileRows, size_t kV = kTileVecs, class TB, class Epilogue>
HWY_INLINE void MatMulStridedA(size_t rows, size_t cols, size_t K, const float* HWY_RESTRICT a,
                               size_t lda, size_t ka, const TB* HWY_RESTRICT b,
                               size_t ldb, const Epilogue& epilogue,
                               const KSegments& chain = KSegments()) {
  ForEachRowTile<kR>(rows, [&](size_t, size_t r0, size_t height) {
    const auto shifted = [&](auto d, size_t r, size_t c, auto acc) {
      epilogue(d, r0 + r, c, acc);
    };
    RowTile<kR, kV, false>(height, cols, K, a + r0 * lda, lda, ka, b, ldb, shifted, chain);
  });
}

// MatMul that also copies B, as f32, into chain.pack (row stride
// chain.pack_ld >= cols; segment s's K rows at pack + s * K * pack_ld): the
// first row tile reads B in place and stores every vector it loads, the
// tiles after it read that contiguous panel.  For a B whose rows are far
// apart (Wo's rows, D floats apart, fall into a few L1 sets), this is the
// copy that the later tiles need, at the price of stores under the first
// tile's FMAs instead of a separate pass.  Same results as MatMul.
template <size_t kR, size_t kV, class TB, class Epilogue>
HWY_INLINE void MatMulPackingB(size_t rows, size_t cols, size_t K, const float* HWY_RESTRICT a,
                               size_t lda, const TB* HWY_RESTRICT b, size_t ldb,
                               const Epilogue& epilogue, const KSegments& chain) {
  KSegments from_pack = chain;
  from_pack.b_step = K * chain.pack_ld;
  from_pack.pack = nullptr;
  ForEachRowTile<kR>(rows, [&](size_t t, size_t r0, size_t height) {
    const auto shifted = [&](auto d, size_t r, size_t c, auto acc) {
      epilogue(d, r0 + r, c, acc);
    };
    if (t == 0) {
      RowTile<kR, kV, true>(height, cols, K, a + r0 * lda, lda, 1, b, ldb, shifted, chain);
    } else {
      RowTile<kR, kV, false>(height, cols, K, a + r0 * lda, lda, 1,
                             static_cast<const float*>(chain.pack), chain.pack_ld, shifted,
                             from_pack);
    }
  });
}

// C = A B for a row-major A [rows][K] (row stride lda), B [K][cols] (row
// stride ldb); epilogue(d, row, col, acc) receives each vector (or single
// lane) of C.  Every element of C is one FMA chain over k in order 0..K-1,
// whatever tile computed it: results do not depend on how callers split
// rows or columns.
template <size_t kR = kTileRows, size_t kV = kTileVecs, class TB, class Epilogue>
HWY_INLINE void MatMul(size_t rows, size_t cols, size_t K, const float* HWY_RESTRICT a,
                       size_t lda, const TB* HWY_RESTRICT b, size_t ldb,
                       const Epilogue& epilogue, const KSegments& chain = KSegments()) {
  MatMulStridedA<kR, kV>(rows, cols, K, a, lda, 1, b, ldb, epilogue, chain);
}

// ---------------------------------------------------------------------------
// Row helpers.  All handle any length: full vectors, then single lanes.

// n rounded up to a whole number of N-lane vectors.
inline size_t RoundUpToVectors(size_t n, size_t N) { return (n + N - 1) / N * N; }

// ForEachVector (full vectors, then single lanes) is in convert-inl.h.

HWY_INLINE void Fill(float* HWY_RESTRICT x, size_t n, float value) {
  ForEachVector(n, [&](auto d, size_t i) { hn::StoreU(hn::Set(d, value), d, x + i); });
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT x, size_t n, float factor) {
  ForEachVector(n, [&](auto d, size_t i) {
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::Set(d, factor)), d, x + i);
  });
}

// max_i x[i]; -inf for n = 0 or a row of -inf; NaN if any x[i] is NaN (so a
// NaN score reaches the outputs that depend on it).  The lanes are reduced
// by hand: EMU128's MaxOfLanes starts from -FLT_MAX, which would turn a row
// of -inf (fully masked) into a finite max.
HWY_INLINE float RowMax(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
  size_t i = 0;
  if (n >= N) {
    auto m = hn::LoadU(d, x);
    // Not(Eq) rather than Ne: Ne is an ordered compare on some x86 targets
    // (NaN != NaN comes out false there), Eq is ordered everywhere.
    auto is_nan = hn::Not(hn::Eq(m, m));
    for (i = N; i + N <= n; i += N) {
      const auto v = hn::LoadU(d, x + i);
      m = hn::Max(m, v);
      is_nan = hn::Or(is_nan, hn::Not(hn::Eq(v, v)));
    }
    nan = !hn::AllFalse(d, is_nan);
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(m, d, lanes);
    for (size_t j = 0; j < N; ++j) best = lanes[j] > best ? lanes[j] : best;
  }
  for (; i < n; ++i) {
    nan |= x[i] != x[i];
    best = x[i] > best ? x[i] : best;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : best;
}

// c[:] += alpha * b[:], n floats.
HWY_INLINE void AddScaled(float alpha, const float* HWY_RESTRICT b, size_t n,
                          float* HWY_RESTRICT c) {
  ForEachVector(n, [&](auto d, size_t i) {
    hn::StoreU(hn::MulAdd(hn::Set(d, alpha), hn::LoadU(d, b + i), hn::LoadU(d, c + i)), d,
               c + i);
  });
}

// Probability-weighted sum of value rows for rows whose key counts differ
// (the causal diagonal):  out[r][:] (+)= sum_{j < keys[r]} P[r][j] V[j][:],
// keys[] non-decreasing.  The register-blocked product runs over the keys
// every row of a 6-row tile sees; the few keys only later rows see are added
// per row, so a row never multiplies a value row it cannot see (0 * NaN
// would leak a NaN from a masked value into it).
// P[r][j] is at p[r * ldp + j * kp] (kp = 1: row-major P; kp > 1: P^T);
// value row j at v + j * ldv.
// accumulate: add to out instead of overwriting it.
HWY_INLINE void WeightedSumRagged(size_t rows, size_t L, const float* HWY_RESTRICT p,
                                  size_t ldp, size_t kp, const size_t* keys,
                                  const float* HWY_RESTRICT v, size_t ldv,
                                  float* HWY_RESTRICT out, size_t ldo, bool accumulate) {
  for (size_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const size_t tile = rows - r0 < kTileRows ? rows - r0 : kTileRows;
    const size_t common = keys[r0];
    const float* HWY_RESTRICT p0 = p + r0 * ldp;
    float* HWY_RESTRICT o0 = out + r0 * ldo;
    if (accumulate) {
      MatMulStridedA<kTileRows, kPvVecs>(tile, L, common, p0, ldp, kp, v, ldv,
                     [&](auto d, size_t r, size_t c, auto acc) {
                       float* HWY_RESTRICT dst = o0 + r * ldo + c;
                       hn::StoreU(hn::Add(hn::LoadU(d, dst), acc), d, dst);
                     });
    } else {
      MatMulStridedA<kTileRows, kPvVecs>(tile, L, common, p0, ldp, kp, v, ldv,
                     [&](auto d, size_t r, size_t c, auto acc) {
                       hn::StoreU(acc, d, o0 + r * ldo + c);
                     });
    }
    for (size_t r = 1; r < tile; ++r) {
      for (size_t j = common; j < keys[r0 + r]; ++j) {
        AddScaled(p0[r * ldp + j * kp], v + j * ldv, L, o0 + r * ldo);
      }
    }
  }
}

// e^x for the arguments softmax needs (x <= 0, -inf included), at about half
// the instructions of hn::Exp: x = n ln2 + r with |r| <= ln2/2, e^r by a
// degree-6 polynomial (a relative-error least-squares fit), 2^n put into the
// exponent bits directly.
//   Accuracy: relative error < 2 ulp (2 * 2^-23) for -87.3 <= x <= 0
//   (tests/numerics_test.cc measures it on every target); 0 for x < -87.3,
//   where e^x < 1.2e-38 (FLT_MIN): subnormal results are flushed.  NaN gives
//   NaN.
template <class D, class V>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  // j = x log2(e) + (1.5 * 2^23 + 127): its low mantissa bits hold n + 127
  // for n = round(x log2(e)), the biased exponent of 2^n.
  const V kShifter = hn::Set(d, 12583039.0f);
  const V j = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), kShifter);
  const V n = hn::Sub(j, kShifter);
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, j)));
  // r = x - n ln2, with ln2 split in two for an exact first product.
  V r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(d, -1.428606765330187e-6f), r);
  // e^r = 1 + r + c2 r^2 + ... + c6 r^6 on |r| <= ln2/2.
  V p = hn::Set(d, 0.001381418900564313f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.008368914015591145f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.04166840761899948f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.1666651964187622f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.4999999403953552f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.3f)), hn::Mul(p, pow2n));
}

// 2^x for x <= 0: the same scheme as ExpNonPositive without the change of
// base, for scores carried in base 2 (s log2(e)): x = n + r, |r| <= 1/2,
// r = x - n exact, 2^r by a degree-6 polynomial (a relative-error fit),
// 2^n into the exponent bits.  Two fewer multiply-adds than ExpNonPositive.
//   Accuracy: relative error < 2 ulp for -126 <= x <= 0 (fit: 0.67 ulp;
//   tests/numerics_test.cc measures it on every target); 0 for x < -126,
//   where 2^x < FLT_MIN.  NaN gives NaN.
template <class D, class V>
HWY_INLINE V Exp2NonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  // j = x + (1.5 * 2^23 + 127): its low mantissa bits hold n + 127 for
  // n = round(x), the biased exponent of 2^n.
  const V kShifter = hn::Set(d, 12583039.0f);
  const V j = hn::Add(x, kShifter);
  const V r = hn::Sub(x, hn::Sub(j, kShifter));
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, j)));
  V p = hn::Set(d, 0.00015353300841525197f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.0013398848241195083f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00961843691766262f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.055503323674201965f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.24022647738456726f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.6931471824645996f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -126.0f)), hn::Mul(p, pow2n));
}

// p[i] = exp(x[i] - shift) for i < n (kBase2: 2^(x[i] - shift)); returns
// sum_i p[i] in a fixed order.  shift >= max x[i], so every argument is <= 0.
template <bool kBase2 = false>
HWY_INLINE float ExpShiftedRow(const float* HWY_RESTRICT x, size_t n, float shift,
                               float* HWY_RESTRICT p) {
  const auto exp = [](auto d, auto v) {
    return kBase2 ? Exp2NonPositive(d, v) : ExpNonPositive(d, v);
  };
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vshift = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = exp(d, hn::Sub(hn::LoadU(d, x + i), vshift));
    hn::StoreU(e, d, p + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) {
    const auto e = exp(d1, hn::Sub(hn::LoadU(d1, x + i), hn::Set(d1, shift)));
    hn::StoreU(e, d1, p + i);
    total += hn::GetLane(e);
  }
  return total;
}

// sum_i x[i]^2 in a fixed order.
HWY_INLINE float SumOfSquares(const float* HWY_RESTRICT x, size_t n, float scale = 1.0f) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vscale = hn::Set(d, scale);
  auto sum = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::Mul(hn::LoadU(d, x + i), vscale);
    sum = hn::MulAdd(v, v, sum);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) total += (x[i] * scale) * (x[i] * scale);
  return total;
}

// ||x||_2 without overflow or underflow in the squares: when the largest
// magnitude is far from 1, the squares are taken of x scaled by a power of
// two near 1 / max|x|.
HWY_INLINE float Norm2(const float* HWY_RESTRICT x, size_t n) {
  float max_abs = 0.0f;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    nan |= a != a;
    max_abs = a > max_abs ? a : max_abs;
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  if (max_abs == 0.0f || max_abs == std::numeric_limits<float>::infinity()) return max_abs;
  if (max_abs < 1e15f && max_abs > 1e-15f) return std::sqrt(SumOfSquares(x, n));
  // A power of two scales exactly.
  const int exponent = std::ilogb(max_abs);
  return std::ldexp(std::sqrt(SumOfSquares(x, n, std::ldexp(1.0f, -exponent))), exponent);
}

// sum_i x[i] y[i] in a fixed order.
// y: f32, or f16/bf16 widened exactly in registers.
template <class TY>
HWY_INLINE float Dot(const float* HWY_RESTRICT x, const TY* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    sum0 = hn::MulAdd(hn::LoadU(d, x + i), LoadF32(d, y + i), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, x + i + N), LoadF32(d, y + i + N), sum1);
  }
  for (; i + N <= n; i += N) {
    sum0 = hn::MulAdd(hn::LoadU(d, x + i), LoadF32(d, y + i), sum0);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) total += x[i] * hn::GetLane(LoadF32(d1, y + i));
  return total;
}

// dst[j][i] = scale * src[i][j]: rows x cols of src (row stride lds) into
// dst (row stride ldd).  Used to pack K^T so that scores come out along
// vectors, with the score scale folded in.  4 x 4 blocks are transposed in
// 128-bit registers (two rounds of interleaves); the edges go element by
// element.
HWY_INLINE void TransposeScaled(const float* HWY_RESTRICT src, size_t rows, size_t cols,
                                size_t lds, float scale, float* HWY_RESTRICT dst, size_t ldd) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  if (hn::Lanes(d4) == 4) {
    const auto vscale = hn::Set(d4, scale);
    for (; i + 4 <= rows; i += 4) {
      const float* HWY_RESTRICT s0 = src + i * lds;
      size_t j = 0;
      for (; j + 4 <= cols; j += 4) {
        const auto r0 = hn::Mul(hn::LoadU(d4, s0 + j), vscale);            // a0 a1 a2 a3
        const auto r1 = hn::Mul(hn::LoadU(d4, s0 + lds + j), vscale);      // b0 b1 b2 b3
        const auto r2 = hn::Mul(hn::LoadU(d4, s0 + 2 * lds + j), vscale);  // c0 ...
        const auto r3 = hn::Mul(hn::LoadU(d4, s0 + 3 * lds + j), vscale);  // d0 ...
        const auto ab01 = hn::InterleaveLower(d4, r0, r1);  // a0 b0 a1 b1
        const auto cd01 = hn::InterleaveLower(d4, r2, r3);  // c0 d0 c1 d1
        const auto ab23 = hn::InterleaveUpper(d4, r0, r1);  // a2 b2 a3 b3
        const auto cd23 = hn::InterleaveUpper(d4, r2, r3);  // c2 d2 c3 d3
        float* HWY_RESTRICT d0 = dst + j * ldd + i;
        hn::StoreU(hn::ConcatLowerLower(d4, cd01, ab01), d4, d0);            // a0 b0 c0 d0
        hn::StoreU(hn::ConcatUpperUpper(d4, cd01, ab01), d4, d0 + ldd);      // a1 b1 c1 d1
        hn::StoreU(hn::ConcatLowerLower(d4, cd23, ab23), d4, d0 + 2 * ldd);  // a2 b2 c2 d2
        hn::StoreU(hn::ConcatUpperUpper(d4, cd23, ab23), d4, d0 + 3 * ldd);  // a3 b3 c3 d3
      }
      for (; j < cols; ++j) {
        float* HWY_RESTRICT d0 = dst + j * ldd + i;
        d0[0] = scale * s0[j];
        d0[1] = scale * s0[lds + j];
        d0[2] = scale * s0[2 * lds + j];
        d0[3] = scale * s0[3 * lds + j];
      }
    }
  }
#endif
  for (; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) dst[j * ldd + i] = scale * src[i * lds + j];
  }
}

// TransposeScaled, with columns [rows, padded) of every dst row set to 0:
// K^T for a register tile that reads whole vectors past the last key.
// Padding to the next whole vector (the tiles' case) is one zero vector per
// row, stored before the transpose writes the row's first columns over its
// start: filled after it, a few floats per row, GCC made each row's fill a
// memset call (128 calls per head, a fifth of an S=20 attention call).
HWY_INLINE void TransposeScaledPadded(const float* HWY_RESTRICT src, size_t rows, size_t cols,
                                      size_t lds, float scale, float* HWY_RESTRICT dst,
                                      size_t ldd, size_t padded) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t last_vector = rows / N * N;
  if (padded > rows && padded - last_vector == N) {
    for (size_t j = 0; j < cols; ++j) hn::StoreU(hn::Zero(d), d, dst + j * ldd + last_vector);
    TransposeScaled(src, rows, cols, lds, scale, dst, ldd);
    return;
  }
  TransposeScaled(src, rows, cols, lds, scale, dst, ldd);
  for (size_t j = 0; j < cols && padded > rows; ++j) {
    Fill(dst + j * ldd + rows, padded - rows, 0.0f);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_MATMUL_INL_H_
