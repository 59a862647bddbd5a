// The shapes the benchmarks sweep: the seed's layer (B=1, H=8, L=64, D=512)
// at growing sequence lengths, prefill (Sq = Skv) causal and not, plus one
// decode step for attention.  One list, so every kernel and its oneDNN twin
// run on exactly the same shapes.
#ifndef HEADSUM_BENCH_BENCH_SHAPES_H_
#define HEADSUM_BENCH_BENCH_SHAPES_H_

#include <cstdint>

namespace headsum {
namespace bench {

inline constexpr int64_t kBatch = 1;
inline constexpr int64_t kHeads = 8;
inline constexpr int64_t kKvHeads = 8;  // MHA; GQA shapes live in the tests
inline constexpr int64_t kHeadDim = 64;
inline constexpr int64_t kModelDim = 512;

// 20 is the seed's sequence length; the rest span cache-resident to DRAM.
inline constexpr int64_t kSeqLens[] = {20, 128, 512, 2048};
// A decode step: one query against a long KV cache.
inline constexpr int64_t kDecodeSeqQ = 1;
inline constexpr int64_t kDecodeSeqKv = 4096;

inline constexpr int kThreadCounts[] = {1, 2};

}  // namespace bench
}  // namespace headsum

#endif  // HEADSUM_BENCH_BENCH_SHAPES_H_
