// Decode streams: one query row over K and V read from memory, K and V side
// by side in 16-key tiles, q and the row's accumulator in registers for the
// whole key range, keys scored eight at a time with software prefetch
// (Intel) or one at a time without it (AMD: AttnDims::stream_key_by_key);
// on the x86 targets with 16 vector registers (AVX2, SSE4, SSSE3) the
// narrow form, key by key.  Wins for a decode step over a long cache that
// does not fit the last-level cache.

#if defined(HEADSUM_KERNELS_ATTENTION_DECODE_STREAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_DECODE_STREAM_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_DECODE_STREAM_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_DECODE_STREAM_INL_H_
#endif

#include "kernels/attention/decode_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

// The streams' tiles: keys per tile, and how many keys ahead the K and V rows are prefetched.
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

// One row over keys [key_begin, end) of K and V of element type T on this
// target's stream.
template <class T>
HWY_INLINE void RowStream(const AttnDims& a, const float* HWY_RESTRICT q_i,
                          const T* HWY_RESTRICT k_g, size_t ldk, const T* HWY_RESTRICT v_g,
                          size_t ldv, size_t key_begin, size_t end, float* HWY_RESTRICT acc,
                          float* m, float* l, float* bad) {
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE && !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3)
  const auto run = [&](auto kc) {
    FlashAttentionRowStream<decltype(kc)::value>(a, q_i, k_g, ldk, v_g, ldv, key_begin, end, acc,
                                                 m, l, bad);
  };
  switch (a.head_dim / hn::Lanes(hn::ScalableTag<float>())) {
    case 1: return run(std::integral_constant<size_t, 1>());
    case 2: return run(std::integral_constant<size_t, 2>());
    case 3: return run(std::integral_constant<size_t, 3>());
    case 4: return run(std::integral_constant<size_t, 4>());
    case 5: return run(std::integral_constant<size_t, 5>());
    case 6: return run(std::integral_constant<size_t, 6>());
    case 7: return run(std::integral_constant<size_t, 7>());
    default: return run(std::integral_constant<size_t, 8>());
  }
#elif HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 && HWY_TARGET != HWY_SCALAR
  FlashAttentionRowStreamNarrow(a, q_i, k_g, ldk, v_g, ldv, key_begin, end, acc, m, l, bad);
#else
  (void)a, (void)q_i, (void)k_g, (void)ldk, (void)v_g, (void)ldv, (void)key_begin, (void)end;
  (void)acc, (void)m, (void)l, (void)bad;
  HWY_ABORT("headsum: no decode stream on this target (the path table never picks it)");
#endif
}

// The decode-stream path: each row of the block on the stream.  K and V of
// one dtype, L a whole number of vectors (at most 8 on the 32-register
// form): dispatch/attention_paths.cc checks it.
HWY_NOINLINE void AttentionRowStreamBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                          size_t h, size_t i0, size_t i1, size_t key_begin,
                                          size_t key_end, float* HWY_RESTRICT partial,
                                          float* HWY_RESTRICT scratch) {
  RowsOneByOne(a, views, b, h, i0, i1, key_begin, key_end, partial, scratch,
               [&](const Block& blk, size_t, const float* HWY_RESTRICT q_r, size_t begin,
                   size_t visible, float* HWY_RESTRICT acc, float* m, float* l, float* bad) {
                 const size_t end = visible < key_end ? visible : key_end;
                 WithElementType(blk.k.dtype, blk.k.base, [&](const auto* k) {
                   using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
                   const T* v = reinterpret_cast<const T*>(blk.v.base);
                   RowStream(a, q_r, k, blk.k.stride, v, blk.v.stride, begin, HWY_MAX(begin, end),
                             acc, m, l, bad);
                 });
               });
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_DECODE_STREAM_INL_H_
