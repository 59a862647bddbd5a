// Decode rows: up to kDotRows query rows, each alone on dot products over
// 512-key tiles of K, then V, read in place in their own element type
// (16-bit widened in registers; a mixed K/V pair widened tile by tile).
// Keys eight at a time (RowScores8), with K/V rows prefetched ahead when they
// come from memory.  Wins for a decode step (one row a head) whose K/V sit in
// the caches, and wherever no stream applies.
//
// Also here, for AVX-512 only: the same rows over f32 K and V that start off
// a 64-byte boundary, read in their aligned frame
// (FlashAttentionRowByDotShifted): a buffer 16 bytes off split every 512-bit
// load across two lines.

#if defined(HEADSUM_KERNELS_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include "kernels/attention/decode_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

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
                                         float* bad, float* HWY_RESTRICT s_row,
                                         const RowExtras* extras, size_t key_base) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
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
    if (extras != nullptr) AddRowExtras(*extras, key_base + j0, nj, s_row);
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
                     float* HWY_RESTRICT s_row, const RowExtras* extras) {
  if (k_g.dtype == v_g.dtype) {
    WithElementType(k_g.dtype, k_g.base, [&](const auto* k) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
      const T* v = reinterpret_cast<const T*>(v_g.base);
      FlashAttentionRowByDot(a, q_i, k, k_g.stride, v, v_g.stride, visible, key_begin,
                             key_end, acc, m, l, bad, s_row, extras, 0);
    });
    return;
  }
  const size_t L = a.head_dim, end = visible < key_end ? visible : key_end;
  for (size_t j0 = key_begin; j0 < end && *bad == 0.0f; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    size_t ldk, ldv;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    FlashAttentionRowByDot(a, q_i, k_tile, ldk, v_tile, ldv, nj, 0, nj, acc, m, l, bad, s_row,
                           extras, j0);
  }
}

// The decode-rows path: each row of the block on dot products.
HWY_NOINLINE void AttentionRowDotBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                       size_t h, size_t i0, size_t i1, size_t key_begin,
                                       size_t key_end, float* HWY_RESTRICT partial,
                                       float* HWY_RESTRICT scratch) {
  RowsOneByOne(a, views, b, h, i0, i1, key_begin, key_end, partial, scratch,
               [&](const Block& blk, size_t r, const float* HWY_RESTRICT q_r, size_t begin,
                   size_t visible, float* HWY_RESTRICT acc, float* m, float* l, float* bad) {
                 RowExtras x;
                 if (AddsToScores(a)) x = ExtrasOf(a, b, h, i0 + r);
                 RowByDot(a, q_r, blk.k, blk.v, visible, begin, key_end, acc, m, l, bad,
                          blk.f.s_row, AddsToScores(a) ? &x : nullptr);
               });
}

// The decode-rows path over f32 K and V read in their aligned frames
// (AVX-512; both ShiftedFrameFits: dispatch/attention_paths.cc checks it).
// On other targets the plain rows (never picked there).
HWY_NOINLINE void AttentionRowShiftedBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                           size_t h, size_t i0, size_t i1, size_t key_begin,
                                           size_t key_end, float* HWY_RESTRICT partial,
                                           float* HWY_RESTRICT scratch) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  RowsOneByOne(a, views, b, h, i0, i1, key_begin, key_end, partial, scratch,
               [&](const Block& blk, size_t, const float* HWY_RESTRICT q_r, size_t begin,
                   size_t visible, float* HWY_RESTRICT acc, float* m, float* l, float* bad) {
                 const size_t L = a.head_dim;
                 const ShiftedRows k(reinterpret_cast<const float*>(blk.k.base), blk.k.stride, L);
                 const ShiftedRows v(reinterpret_cast<const float*>(blk.v.base), blk.v.stride, L);
                 FlashAttentionRowByDotShifted(a, q_r, k, v, visible, begin, key_end, acc, m, l,
                                               bad, blk.f.s_row);
               });
#else
  AttentionRowDotBlock(a, views, b, h, i0, i1, key_begin, key_end, partial, scratch);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_DECODE_ROWS_INL_H_
