// The decode-rows paths (kernels/attention/decode_rows-inl.h) for every
// compiled target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/attention_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/attention/decode_rows-inl.h"

#if HWY_ONCE
#include "dispatch/attention_paths.h"

namespace headsum {
HWY_EXPORT(AttentionRowDotBlock);
HWY_EXPORT(AttentionRowShiftedBlock);
namespace dispatch {
namespace attn {
AttnBlockFn RowDotBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionRowDotBlock)[t]; }
AttnBlockFn RowShiftedBlock(size_t t) { return HWY_DISPATCH_TABLE(AttentionRowShiftedBlock)[t]; }
}  // namespace attn
}  // namespace dispatch
}  // namespace headsum
#endif  // HWY_ONCE
