// The decode-groups path (kernels/attention/decode_groups-inl.h) for every
// compiled target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/attention_groups.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/attention/decode_groups-inl.h"

#if HWY_ONCE
#include "dispatch/attention_paths.h"

namespace headsum {
HWY_EXPORT(AttentionGroupsBlock);
namespace dispatch {
namespace attn {
AttnBlockFn GroupsBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionGroupsBlock)[t]; }
}  // namespace attn
}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
