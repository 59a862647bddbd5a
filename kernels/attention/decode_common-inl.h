// What the dot-product paths (decode rows, streams, grouped rows) share:
// P V into one row's accumulator (RescaleAddWeightedRows), the reductions of
// several dot products at once (StoreSumsOfLanes8/4), and one row's online
// softmax over a tile of scores (RowTileSoftmax).

#if defined(HEADSUM_KERNELS_ATTENTION_DECODE_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_DECODE_COMMON_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_DECODE_COMMON_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_DECODE_COMMON_INL_H_
#endif

#include "kernels/attention/common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

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

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// out[k] = the sum of the lanes of v_k, k = 0..3, as StoreSumsOfLanes8 sums
// them (per 128-bit block, then the blocks): the same bits.
template <class V>
HWY_INLINE void StoreSumsOfLanes4(V v0, V v1, V v2, V v3, float* HWY_RESTRICT out) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0.raw, v1.raw), _mm256_hadd_ps(v2.raw, v3.raw));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
}
#endif

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

// A block whose rows each run alone (the decode rows, the stream): for each
// row r, row(blk, r, q_r, begin_r, visible_r, acc_r, &m_r, &l_r, &bad_r)
// adds the row's keys [begin_r, min(visible_r, key_end)) into its
// accumulator, zeroed first (begin_r: key_begin, or the row's sliding
// window's first key past it).
template <class Row>
HWY_INLINE void RowsOneByOne(const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                             size_t i0, size_t i1, size_t key_begin, size_t key_end,
                             float* HWY_RESTRICT partial, float* HWY_RESTRICT scratch,
                             const Row& row) {
  const Block blk = StartBlock(a, views, b, h, i0, i1, scratch);
  const FlashScratch& f = blk.f;
  const size_t L = a.head_dim;
  Fill(f.acc, blk.rows * L, 0.0f);
  for (size_t r = 0; r < blk.rows; ++r) {
    const size_t begin = HWY_MAX(key_begin, a.first_key(i0 + r));
    const size_t visible = a.visible_keys(i0 + r);
    if (blk.k.pages == nullptr) {
      row(blk, r, blk.q + r * blk.ldq, begin, visible, f.acc + r * L, f.m + r, f.l + r,
          f.bad + r);
      continue;
    }
    // A paged cache: the row's keys block by block, its running state
    // carried across them.
    ForEachKeyRun(blk.k, blk.v, begin, HWY_MIN(visible, key_end), L,
                  [&](const KvRows& k, const KvRows& v, size_t j0, size_t j1) {
                    Block run = blk;
                    run.k = k;
                    run.v = v;
                    row(run, r, blk.q + r * blk.ldq, j0, j1, f.acc + r * L, f.m + r, f.l + r,
                        f.bad + r);
                  });
  }
  EndBlock(a, blk, partial);
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_DECODE_COMMON_INL_H_
