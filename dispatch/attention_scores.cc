// The unfused attention kernels (qk_scores, softmax_v) for every compiled
// target, and their split of work across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/attention_scores.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/qk_scores-inl.h"
#include "kernels/softmax_v-inl.h"

#if HWY_ONCE
#include "dispatch/attention_paths.h"
#include "dispatch/ops.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"
#include "dispatch/test_hooks.h"

namespace headsum {
HWY_EXPORT(QDotKRows);
HWY_EXPORT(QkScoresScratch);
HWY_EXPORT(SoftmaxWeightedSumVRows);
HWY_EXPORT(SoftmaxVScratch);

namespace dispatch {
namespace {

// Query rows per work item of qk_scores: each item packs K^T once per key
// chunk, so many rows amortize the packing.
constexpr size_t kScoreRowBlock = 512;
// Query rows per work item of softmax_v.
constexpr size_t kRowBlock = 64;

}  // namespace

headsum_status QkScores(const AttnDims& a, const float* q, const float* k, float* scores) {
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(QDotKRows)[t];
  const RowBlocks blocks{a, kScoreRowBlock};
  const bool stream =
      a.batch * a.heads * a.seq_q * a.seq_kv * sizeof(float) > StreamScoresBytes();
  return ParallelItems(blocks.count(), HWY_DISPATCH_TABLE(QkScoresScratch)[t](a),
                       [&](size_t item, float* scratch) {
                         blocks.Run(item, [&](size_t b, size_t h, size_t i0, size_t i1) {
                           kernel(a, q, k, scores, b, h, i0, i1, stream, scratch);
                         });
                       });
}

headsum_status SoftmaxV(const AttnDims& a, const float* scores, const float* v, float* out) {
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(SoftmaxWeightedSumVRows)[t];
  const RowBlocks blocks{a, kRowBlock};
  return ParallelItems(blocks.count(), HWY_DISPATCH_TABLE(SoftmaxVScratch)[t](a),
                       [&](size_t item, float* scratch) {
                         blocks.Run(item, [&](size_t b, size_t h, size_t i0, size_t i1) {
                           kernel(a, scores, v, out, b, h, i0, i1, scratch);
                         });
                       });
}

}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
