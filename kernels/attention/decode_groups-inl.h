// Decode groups: query rows that all see the same keys (the query heads of
// a GQA/MQA decode step, which dispatch turns into one head of H/Hkv rows;
// a short prefill block on wide vectors), kGroupRows at a time on dot
// products: each K and V row read once for the four rows, in place in its
// own element type.  bf16 rows are read as element pairs (LoadBf16Pair),
// q and the sums deinterleaved to match.  Wins over the key-tiled paths
// wherever the rows are too few to fill the lanes of a transposed tile.

#if defined(HEADSUM_KERNELS_ATTENTION_DECODE_GROUPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADSUM_KERNELS_ATTENTION_DECODE_GROUPS_INL_H_
#undef HEADSUM_KERNELS_ATTENTION_DECODE_GROUPS_INL_H_
#else
#define HEADSUM_KERNELS_ATTENTION_DECODE_GROUPS_INL_H_
#endif

#include "kernels/attention/decode_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {

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
constexpr size_t kGroupRows = kAttentionGroupRows;
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
// slower again, for reasons not found.)
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
// columns in whole vectors of N), its loads of V giving `unit` vectors
// each: on AVX2 three for one-vector loads (12 FMA chains: a pair's 8 leave
// the FMA latency no slack, as in the scores) while more than four remain
// (L = 128: four triples, then two pairs); else two (a bf16 pair's load
// gives two vectors, half a triple's columns).
inline size_t GroupPvVecs(size_t cc, size_t lv, size_t N, size_t unit) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if (unit == 1 && cc + 3 * N <= lv && lv - cc != 4 * N) return 3;
#endif
  (void)cc;
  (void)lv;
  (void)N;
  (void)unit;
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

// How the grouped decode (FlashAttentionGroupByDot) reads the rows of K and
// V (its Rows): a load of the row at p gives kVecs vectors (Load; LoadTwo:
// the 2N columns from p as two vectors), their columns in the order in
// which the scores pair q's terms with them and P V keeps its sums; Queries
// lays q's rows out in that order, and AddTwo adds two vectors of sums, in
// that order, into 2N columns of acc, in column order.  A lane of an
// accumulator sums the columns that land in it, so the order sets which
// terms a chain adds: ColumnRows and Bf16PairRows round differently.

// f32, f16 or bf16 rows in column order, a vector of N columns a load
// (LoadF32: 16-bit elements widened in registers); q read as it is.
template <class T>
struct ColumnRows {
  using Elem = T;
  static constexpr size_t kVecs = 1;
  // P V's prefetches of the next block issue every line their credit allows
  // (SpreadLines<false>).
  static constexpr bool kPvOneLine = false;

  template <class D, class V>
  static HWY_INLINE void Load(D d, const T* HWY_RESTRICT p, V& x0, V& /*unused*/) {
    x0 = LoadF32(d, p);
  }
  template <class D, class V>
  static HWY_INLINE void LoadTwo(D d, const T* HWY_RESTRICT p, V& x0, V& x1) {
    x0 = LoadF32(d, p);
    x1 = LoadF32(d, p + hn::Lanes(d));
  }
  // q's R rows for the scores (their stride in *ld): q itself.
  static const float* Queries(const float* HWY_RESTRICT q_blk, size_t ldq, size_t /*L*/,
                              float* HWY_RESTRICT /*qp*/, size_t* ld) {
    *ld = ldq;
    return q_blk;
  }
  // a[0, 2N) = c a + (x0, x1).
  template <class D, class V>
  static HWY_INLINE void AddTwo(D d, float* HWY_RESTRICT a, V c, V x0, V x1) {
    const size_t N = hn::Lanes(d);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a), c, x0), d, a);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a + N), c, x1), d, a + N);
  }
};

// bf16 rows with L a multiple of 2N (GroupsBf16Pairs), each 2N-element
// block loaded as N u32 lanes (LoadBf16Pair): its even elements the low
// halves shifted up, its odd ones the high halves masked, one integer op per
// vector of K or V where widening a vector alone takes two (zero-extend,
// shift).  q's rows are deinterleaved the same way once per call (into qp),
// so that each score is the same dot product with its terms paired
// differently; P V sums each row's output deinterleaved too (o_tmp) and
// interleaves it back once per key tile, when it is added to acc.  Per key
// pair and 2N columns the scores take 16 FMAs + 4 integer ops instead of
// 16 + 8 (shift, widen), P V per key 8 FMAs + 2 instead of 8 + 4: the FMA
// ports' other work.  Measured on the Sapphire Rapids VM (H=32 Hkv=8
// Skv=256, K/V in L2, one thread, medians of 2000 calls, 6 runs alternated
// with the column-order rows): L=128 52.9-58.0 vs 58.9-85.1 us, L=64
// 39.1-39.9 vs 42.1-42.9 us.  Over a cache read from memory (Skv=32768)
// the two are alike (paired runs: ratio 1.00, quartiles 0.96-1.08): that
// step waits on memory, not on the ports.
struct Bf16PairRows {
  using Elem = hwy::bfloat16_t;
  static constexpr size_t kVecs = 2;
  // A pass of P V reads 2N bf16 of each row: where that is at most half a
  // line (AVX2, SSE4, NEON) a row has no more lines (2L/64 + 1) than passes
  // (L/2N), so the next block's lines are at most its calls and SpreadLines
  // issues one at most a call (the form measured fastest on Zen 3).  Where a
  // pass reads a whole line (AVX-512: L = 128 is 4 passes and 4-5 lines a
  // row) it must issue more: with one at most, a fifth of each next block's
  // lines (its last rows) went unprefetched, and on a Zen 4 VM (H=32 Hkv=8
  // L=128 Skv=32768, one thread, 3 alternated rounds) bf16 K/V took
  // 10.9-12.4 ms (min of 10) against 9.3-10.1 issuing them all (f16:
  // 8.8-9.3).
  static constexpr bool kPvOneLine = 2 * HWY_LANES(float) * sizeof(Elem) <= 32;

  template <class D, class V>
  static HWY_INLINE void Load(D d, const Elem* HWY_RESTRICT p, V& even, V& odd) {
    LoadBf16Pair(d, p, even, odd);
  }
  template <class D, class V>
  static HWY_INLINE void LoadTwo(D d, const Elem* HWY_RESTRICT p, V& even, V& odd) {
    LoadBf16Pair(d, p, even, odd);
  }
  // qp[r * L + c + (0, N)] = row r's even, odd columns of [c, c + 2N).
  static const float* Queries(const float* HWY_RESTRICT q_blk, size_t ldq, size_t L,
                              float* HWY_RESTRICT qp, size_t* ld) {
    const hn::ScalableTag<float> d;
    const size_t N = hn::Lanes(d);
    for (size_t r = 0; r < kGroupRows; ++r) {
      for (size_t c = 0; c < L; c += 2 * N) {
        hn::Vec<decltype(d)> even, odd;
        hn::LoadInterleaved2(d, q_blk + r * ldq + c, even, odd);
        hn::StoreU(even, d, qp + r * L + c);
        hn::StoreU(odd, d, qp + r * L + c + N);
      }
    }
    *ld = L;
    return qp;
  }
  // a[0, 2N) = c a + the 2N sums whose even columns are in `even`, odd in `odd`.
  template <class D, class V>
  static HWY_INLINE void AddTwo(D d, float* HWY_RESTRICT a, V c, V even, V odd) {
    const size_t N = hn::Lanes(d);
    HWY_ALIGN float pair[2 * HWY_MAX_BYTES / sizeof(float)];
    hn::StoreInterleaved2(even, odd, d, pair);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a), c, hn::Load(d, pair)), d, a);
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a + N), c, hn::Load(d, pair + N)), d, a + N);
  }
};

// Whether bf16 K and V are read as Bf16PairRows: L a multiple of 2N.
inline bool GroupsBf16Pairs(size_t L) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  return HWY_TARGET != HWY_SCALAR && L % (2 * N) == 0;
}

// The grouped decode for the kGroupRows query rows at q_blk over keys
// [key_begin, min(visible, key_end)) of K and V read as Rows reads them
// (ColumnRows<T>, Bf16PairRows): acc, m, l, bad move on; s_keys holds a
// tile's scores, o_tmp R rows of P V sums (and for Bf16PairRows q's R rows
// after them).
template <class Rows>
HWY_NOINLINE void FlashAttentionGroupByDot(const AttnDims& a, const float* HWY_RESTRICT q_blk,
                                           size_t ldq, const typename Rows::Elem* HWY_RESTRICT k_g,
                                           size_t ldk, const typename Rows::Elem* HWY_RESTRICT v_g,
                                           size_t ldv, size_t visible, size_t key_begin,
                                           size_t key_end, float* HWY_RESTRICT acc, float* m,
                                           float* l, float* bad, float* HWY_RESTRICT s_keys,
                                           float* HWY_RESTRICT o_tmp) {
  using T = typename Rows::Elem;
  constexpr size_t R = kGroupRows;
  constexpr size_t kU = Rows::kVecs;  // vectors a load of a row gives
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const size_t L = a.head_dim;
  const size_t end = visible < key_end ? visible : key_end;
  const float scale2 = Base2Scale(a);
  const size_t lv = L / N * N;  // columns in whole vectors; the rest lane by lane
  size_t ldqr;                  // q's rows for the scores, in Rows' column order
  const float* HWY_RESTRICT qr = Rows::Queries(q_blk, ldq, L, o_tmp + R * L, &ldqr);
  // P V's passes of two or three vectors of columns over a block of keys
  // (none: one pass over all the keys, or narrower ones only).  With them,
  // K/V from DRAM, P V prefetches each next block's V rows, spread over the
  // block's passes (a block, ~400 ns at L = 128, ahead), and the scores
  // loop only the first block's; without them the scores loop prefetches
  // all the tile's V rows.  (Formerly the scores loop
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
    for (size_t cc = 0; cc + 2 * N <= lv; cc += GroupPvVecs(cc, lv, N, kU) * N) ++pv_passes;
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
      const auto qv = [&](size_t r, size_t c) { return hn::LoadU(d, qr + r * ldqr + c * N); };
      const V q00 = qv(0, 0), q01 = qv(0, 1), q02 = qv(0, 2), q03 = qv(0, 3);
      const V q10 = qv(1, 0), q11 = qv(1, 1), q12 = qv(1, 2), q13 = qv(1, 3);
      const V q20 = qv(2, 0), q21 = qv(2, 1), q22 = qv(2, 2), q23 = qv(2, 3);
      const V q30 = qv(3, 0), q31 = qv(3, 1), q32 = qv(3, 2), q33 = qv(3, 3);
      for (; j + 2 <= nj; j += 2) {
        prefetch_keys(j, 2);
        const T* HWY_RESTRICT k0 = k_tile + j * ldk;
        const T* HWY_RESTRICT k1 = k0 + ldk;
        V a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
        V a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        // The 2N columns from c: the rows' q vectors r0..r3 for the first
        // vector of each key, s0..s3 for the second.
        const auto two = [&](size_t c, V r0, V r1, V r2, V r3, V s0, V s1, V s2, V s3) {
          V x0, y0, x1, y1;
          Rows::LoadTwo(d, k0 + c, x0, y0);
          Rows::LoadTwo(d, k1 + c, x1, y1);
          a00 = hn::MulAdd(r0, x0, a00);
          a01 = hn::MulAdd(r1, x0, a01);
          a02 = hn::MulAdd(r2, x0, a02);
          a03 = hn::MulAdd(r3, x0, a03);
          a10 = hn::MulAdd(r0, x1, a10);
          a11 = hn::MulAdd(r1, x1, a11);
          a12 = hn::MulAdd(r2, x1, a12);
          a13 = hn::MulAdd(r3, x1, a13);
          a00 = hn::MulAdd(s0, y0, a00);
          a01 = hn::MulAdd(s1, y0, a01);
          a02 = hn::MulAdd(s2, y0, a02);
          a03 = hn::MulAdd(s3, y0, a03);
          a10 = hn::MulAdd(s0, y1, a10);
          a11 = hn::MulAdd(s1, y1, a11);
          a12 = hn::MulAdd(s2, y1, a12);
          a13 = hn::MulAdd(s3, y1, a13);
        };
        two(0, q00, q10, q20, q30, q01, q11, q21, q31);
        two(2 * N, q02, q12, q22, q32, q03, q13, q23, q33);
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
      static_assert(kU == 1, "column-order rows");
      for (; lv == L && j + 3 <= nj; j += 3) {
        prefetch_keys(j, 3);
        const T* HWY_RESTRICT k0 = k_tile + j * ldk;
        const T* HWY_RESTRICT k1 = k0 + ldk;
        const T* HWY_RESTRICT k2 = k1 + ldk;
        V a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00;
        V a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        for (size_t c = 0; c < L; c += N) {
          const V x0 = LoadF32(d, k0 + c), x1 = LoadF32(d, k1 + c), x2 = LoadF32(d, k2 + c);
          const auto row = [&](size_t r, V& s0, V& s1, V& s2) {
            V q = hn::LoadU(d, qr + r * ldqr + c);
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
      V a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
      V a10 = a00, a11 = a00, a12 = a00, a13 = a00;
      for (size_t c = 0; c < lv; c += kU * N) {
        V x0, y0, x1, y1;  // keys j and j + 1: the kU vectors of each from c
        Rows::Load(d, k0 + c, x0, y0);
        Rows::Load(d, k1 + c, x1, y1);
        const float* HWY_RESTRICT qc = qr + c;
        const auto row = [&](size_t r, V& s0, V& s1) {
          V q0 = hn::LoadU(d, qc + r * ldqr), q1 = q0;
          if constexpr (kU == 2) q1 = hn::LoadU(d, qc + r * ldqr + N);
          KeepInRegister(q0);
          if constexpr (kU == 2) KeepInRegister(q1);
          s0 = hn::MulAdd(q0, x0, s0);
          s1 = hn::MulAdd(q0, x1, s1);
          if constexpr (kU == 2) {
            s0 = hn::MulAdd(q1, y0, s0);
            s1 = hn::MulAdd(q1, y1, s1);
          }
        };
        row(0, a00, a10);
        row(1, a01, a11);
        row(2, a02, a12);
        row(3, a03, a13);
      }
      HWY_ALIGN float s01[2 * R];
      StoreSumsOfLanes8(d, a00, a01, a02, a03, a10, a11, a12, a13, s01);
      if constexpr (kU == 1) {  // the columns past whole vectors (Bf16PairRows: none)
        float* s0 = s01;
        float* s1 = s01 + R;
        const hn::CappedTag<float, 1> d1;
        for (size_t c = lv; c < L; ++c) {
          const float x0 = hn::GetLane(LoadF32(d1, k0 + c)), x1 = hn::GetLane(LoadF32(d1, k1 + c));
          for (size_t r = 0; r < R; ++r) {
            s0[r] += qr[r * ldqr + c] * x0;
            s1[r] += qr[r * ldqr + c] * x1;
          }
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
    // acc[r] = corr[r] acc[r] + sum_j P[r][j] V[j], the sums in Rows' column
    // order until they are added into acc (AddTwo).
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
      V o00 = hn::Zero(d), o01 = o00, o02 = o00, o03 = o00, o10 = o00, o11 = o00, o12 = o00;
      V o13 = o00, o20 = o00, o21 = o00, o22 = o00, o23 = o00, o30 = o00, o31 = o00;
      V o32 = o00, o33 = o00;
      const T* HWY_RESTRICT v_j = v_tile;
      const float* HWY_RESTRICT p_j = s_keys;
      for (size_t jj = 0; jj < nj; ++jj, v_j += ldv, p_j += R) {
        prefetch_v(jj);
        V x0, x1, x2, x3;
        Rows::LoadTwo(d, v_j, x0, x1);
        Rows::LoadTwo(d, v_j + 2 * N, x2, x3);
        const auto add = [&](float w, V& y0, V& y1, V& y2, V& y3) {
          const V p = hn::Set(d, w);
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
        const V cr = hn::Set(d, corr[r]);
        Rows::AddTwo(d, a_r, cr, y0, y1);
        Rows::AddTwo(d, a_r + 2 * N, cr, y2, y3);
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
      // One vector or lane of columns in column order: the columns past
      // whole pairs of vectors (ColumnRows only; Bf16PairRows has none).
      const auto block = [&](auto dc, size_t cc, size_t jb, size_t nb) {
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
        size_t lines;  // from DRAM: the next block's V rows, spread over the block's calls
        auto next_v = NextPvBlock(a, v_tile, ldv, jb, nj, pv_passes, &lines);
        size_t credit = 0;
        const size_t calls = pv_passes * nb;
        const auto prefetch = [&](size_t) {
          SpreadLines<Rows::kPvOneLine>(next_v, credit, lines, calls);
        };
        size_t cc = c;
        while (cc + 2 * N <= lv) {  // each column's chain is the same in any pass width
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
          if constexpr (kU == 1) {
            if (GroupPvVecs(cc, lv, N, kU) == 3) {
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
          }
#endif
          GroupPvBlock<2>(
              [&](const T* HWY_RESTRICT v, V& x0, V& x1, V&) { Rows::LoadTwo(d, v, x0, x1); },
              v_tile, ldv, s_keys, jb, nb, cc, L, first, lines != 0, prefetch, o_tmp);
          cc += 2 * N;
        }
        if constexpr (kU == 1) {
          for (; cc + N <= lv; cc += N) block(d, cc, jb, nb);
          for (; cc < L; ++cc) block(d1, cc, jb, nb);
        }
      }
      for (size_t r = 0; r < R; ++r) {  // acc = corr acc + P V, in column order
        if (!use[r]) continue;
        float* HWY_RESTRICT a_r = acc + r * L;
        const float* HWY_RESTRICT o_r = o_tmp + r * L;
        const V cr = hn::Set(d, corr[r]);
        size_t cc = c;
        for (; cc + 2 * N <= lv; cc += 2 * N) {
          Rows::AddTwo(d, a_r + cc, cr, hn::LoadU(d, o_r + cc), hn::LoadU(d, o_r + cc + N));
        }
        if constexpr (kU == 1) {  // the columns past whole pairs of vectors
          for (; cc + N <= lv; cc += N) {
            hn::StoreU(hn::MulAdd(hn::LoadU(d, a_r + cc), cr, hn::LoadU(d, o_r + cc)), d,
                       a_r + cc);
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
}

// FlashAttentionGroupByDot for K and V of their views' dtypes: bf16 pairs
// (Bf16PairRows) where both are bf16 and L allows, else column order in the
// shared dtype (a mixed pair widened tile by tile, as RowByDot does).
inline void GroupByDot(const AttnDims& a, const float* HWY_RESTRICT q_blk, size_t ldq,
                       const KvRows& k_g, const KvRows& v_g, size_t visible, size_t key_begin,
                       size_t key_end, float* HWY_RESTRICT acc, float* m, float* l, float* bad,
                       float* HWY_RESTRICT s_rows, float* HWY_RESTRICT o_tmp) {
  if (k_g.dtype == v_g.dtype) {
    if (k_g.dtype == DType::kBF16 && GroupsBf16Pairs(a.head_dim)) {
      FlashAttentionGroupByDot<Bf16PairRows>(
          a, q_blk, ldq, reinterpret_cast<const hwy::bfloat16_t*>(k_g.base), k_g.stride,
          reinterpret_cast<const hwy::bfloat16_t*>(v_g.base), v_g.stride, visible, key_begin,
          key_end, acc, m, l, bad, s_rows, o_tmp);
      return;
    }
    WithElementType(k_g.dtype, k_g.base, [&](const auto* k) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
      const T* v = reinterpret_cast<const T*>(v_g.base);
      FlashAttentionGroupByDot<ColumnRows<T>>(a, q_blk, ldq, k, k_g.stride, v, v_g.stride,
                                              visible, key_begin, key_end, acc, m, l, bad,
                                              s_rows, o_tmp);
    });
    return;
  }
  const size_t L = a.head_dim, end = visible < key_end ? visible : key_end;
  for (size_t j0 = key_begin; j0 < end; j0 += kDotKeyTile) {
    const size_t nj = end - j0 < kDotKeyTile ? end - j0 : kDotKeyTile;
    size_t ldk, ldv;
    const float* HWY_RESTRICT k_tile = k_g.Tile(j0, nj, L, &ldk);
    const float* HWY_RESTRICT v_tile = v_g.Tile(j0, nj, L, &ldv);
    FlashAttentionGroupByDot<ColumnRows<float>>(a, q_blk, ldq, k_tile, ldk, v_tile, ldv, nj, 0,
                                                nj, acc, m, l, bad, s_rows, o_tmp);
  }
}

// The decode-groups path: rows that all see the same keys, a multiple of
// kGroupRows of them (dispatch gives the rest of a block to a row path).
HWY_NOINLINE void AttentionGroupsBlock(const AttnDims& a, const AttnViews& views, size_t b,
                                       size_t h, size_t i0, size_t i1, size_t key_begin,
                                       size_t key_end, float* HWY_RESTRICT partial,
                                       float* HWY_RESTRICT scratch) {
  const Block blk = StartBlock(a, views, b, h, i0, i1, scratch);
  const FlashScratch& f = blk.f;
  const size_t L = a.head_dim, visible = a.visible_keys(i0);
  Fill(f.acc, blk.rows * L, 0.0f);
  for (size_t r = 0; r + kGroupRows <= blk.rows; r += kGroupRows) {
    // (A paged cache block by block, the rows' state carried across.)
    ForEachKeyRun(blk.k, blk.v, key_begin, HWY_MIN(visible, key_end), L,
                  [&](const KvRows& k, const KvRows& v, size_t j0, size_t j1) {
                    GroupByDot(a, blk.q + r * blk.ldq, blk.ldq, k, v, j1, j0, j1,
                               f.acc + r * L, f.m + r, f.l + r, f.bad + r, f.s_t, f.k_t);
                  });
  }
  EndBlock(a, blk, partial);
}

}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#endif  // HEADSUM_KERNELS_ATTENTION_DECODE_GROUPS_INL_H_
