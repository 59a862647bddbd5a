// The prefill paths (kernels/attention/prefill_tiles-inl.h,
// rows_by_keys-inl.h), the head packing and the key-split merge around
// them, and the scratch every path shares, for every compiled target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/attention_prefill.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/attention/head_pack-inl.h"
#include "kernels/attention/key_split-inl.h"
#include "kernels/attention/prefill_tiles-inl.h"
#include "kernels/attention/rows_by_keys-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headsum {
namespace HWY_NAMESPACE {
// This target's f32 lanes (the path table's unit of width).
inline size_t AttentionLanes() { return hn::Lanes(hn::ScalableTag<float>()); }
}  // namespace HWY_NAMESPACE
}  // namespace headsum
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "dispatch/attention_paths.h"

namespace headsum {
HWY_EXPORT(AttentionTilesBlock);
HWY_EXPORT(AttentionRowsByKeysBlock);
HWY_EXPORT(AttentionLanes);
HWY_EXPORT(AttentionScratch);
HWY_EXPORT(HeadPackFloats);
HWY_EXPORT(HeadPackedScratch);
HWY_EXPORT(PackHeadViews);
HWY_EXPORT(MergeScratch);
HWY_EXPORT(MergeKeySplits);
namespace dispatch {
namespace attn {
AttnBlockFn TilesBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionTilesBlock)[t]; }
AttnBlockFn RowsByKeysBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionRowsByKeysBlock)[t]; }
size_t Lanes(size_t t) { return HWY_DISPATCH_TABLE(AttentionLanes)[t](); }
size_t ScratchFloats(size_t t, const AttnDims& a, const AttnViews& views) {
  return HWY_DISPATCH_TABLE(AttentionScratch)[t](a, views);
}
size_t HeadPackFloats(size_t t, const AttnDims& a, const AttnViews& views) {
  return HWY_DISPATCH_TABLE(HeadPackFloats)[t](a, views);
}
size_t HeadPackedScratchFloats(size_t t, const AttnDims& a, const AttnViews& views) {
  return HWY_DISPATCH_TABLE(HeadPackedScratch)[t](a, views);
}
void PackHeadViews(size_t t, const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                   uint64_t call, float* scratch, AttnViews* packed) {
  HWY_DISPATCH_TABLE(PackHeadViews)[t](a, views, b, h, call, scratch, packed);
}
size_t MergeScratchFloats(size_t t, const AttnDims& a) {
  return HWY_DISPATCH_TABLE(MergeScratch)[t](a);
}
void MergeKeySplits(size_t t, const AttnDims& a, const float* partials, size_t splits,
                    const TensorView& out, size_t b, size_t h, size_t i0, size_t i1,
                    float* scratch) {
  HWY_DISPATCH_TABLE(MergeKeySplits)[t](a, partials, splits, out, b, h, i0, i1, scratch);
}
}  // namespace attn
}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
