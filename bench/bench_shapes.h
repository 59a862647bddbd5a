// The shapes the benchmarks sweep: the seed's layer (tests/shapes.h's
// SeedShape: B=1, H=8, L=64, D=512) at growing sequence lengths, prefill
// (Sq = Skv) causal and not, plus one decode step for attention.  One list,
// so every kernel and its oneDNN twin run on exactly the same shapes.
#ifndef HEADSUM_BENCH_BENCH_SHAPES_H_
#define HEADSUM_BENCH_BENCH_SHAPES_H_

#include <cstdint>

#include "tests/shapes.h"

namespace headsum {
namespace bench {

// 20 is the seed's sequence length; the rest span cache-resident to DRAM.
inline constexpr int64_t kSeqLens[] = {20, 128, 512, 2048};
// Long-context prefill, attention and projection only (oneDNN's composed
// attention materializes a 2 GiB score tensor there, and a 2 GiB causal mask).
inline constexpr int64_t kLongSeqLens[] = {8192};
// A decode step: one query against a long KV cache.
inline constexpr int64_t kDecodeSeqQ = 1;
inline constexpr int64_t kDecodeSeqKv = 4096;
// The decode step again with grouped-query attention: 4 query heads per
// kv head (H = 8, Hkv = 2).
inline constexpr int64_t kDecodeGqaKvHeads = 2;

// The long-cache decode step: H = 32, L = 128, Skv = 32768 (f32 K+V: 1 GiB).
inline constexpr int64_t kLongDecodeSeqKv = 32768;
inline constexpr int64_t kLongDecodeHeads = 32;
inline constexpr int64_t kLongDecodeHeadDim = 128;

inline constexpr int kThreadCounts[] = {1, 2};

// The seed layer with its sequence lengths replaced.
inline headsum_shapes::MhaShape SeedAt(int64_t seq_q, int64_t seq_kv, bool causal) {
  headsum_shapes::MhaShape s = headsum_shapes::SeedShape(causal);
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  return s;
}

}  // namespace bench
}  // namespace headsum

#endif  // HEADSUM_BENCH_BENCH_SHAPES_H_
