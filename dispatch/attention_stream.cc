// The decode-stream path (kernels/attention/decode_stream-inl.h) for every
// compiled target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/attention_stream.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/attention/decode_stream-inl.h"

#if HWY_ONCE
#include "dispatch/attention_paths.h"

namespace headsum {
HWY_EXPORT(AttentionRowStreamBlock);
namespace dispatch {
namespace attn {
AttnBlockFn RowStreamBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionRowStreamBlock)[t]; }
}  // namespace attn
}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
