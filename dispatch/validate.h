// Argument checks for every public call: each failure returns a status and
// leaves a thread-local message naming the argument and its value.
#ifndef HEADSUM_DISPATCH_VALIDATE_H_
#define HEADSUM_DISPATCH_VALIDATE_H_

#include <stddef.h>
#include <stdint.h>

#include "headsum/headsum.h"
#include "kernels/shapes.h"

namespace headsum {
namespace dispatch {

// The largest tensor a call accepts, in elements: its byte size must fit a
// signed pointer difference, so every index computed inside stays exact.
constexpr uint64_t kMaxElements = static_cast<uint64_t>(PTRDIFF_MAX) / sizeof(float);

// Records "fn: message" as this thread's last error and returns `status`.
headsum_status Fail(headsum_status status, const char* fn, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
void ClearError();
const char* LastError();

// Each returns HEADSUM_OK or fails with the offending argument named.
headsum_status CheckPointer(const char* fn, const char* name, const void* p);
// value >= 1: "<name> = <value> must be >= 1" otherwise.
headsum_status CheckAtLeastOne(const char* fn, const char* name, int64_t value);
// Fills `dims` from `shape` (kv_heads 0 -> heads, scale 0 -> 1/sqrt(L)).
headsum_status CheckAttnShape(const char* fn, const headsum_attn_shape* shape,
                              AttnDims* dims);
headsum_status CheckProjShape(const char* fn, const headsum_proj_shape* shape,
                              ProjDims* dims);
// a * b * c * d as an element count of tensor `name`, or a failure if it
// overflows or passes kMaxElements.
headsum_status CheckElements(const char* fn, const char* name, uint64_t* count, int64_t a,
                             int64_t b, int64_t c = 1, int64_t d = 1);

// The bytes a view spans: [lo, hi], both inclusive.
struct ByteRange {
  uintptr_t lo = 0, hi = 0;
  bool Meets(const ByteRange& o) const { return lo <= o.hi && o.lo <= hi; }
};

// Checks the view `t` of tensor `name` over extents dims[4] = [b][h][s][l]
// (strides i with uses[i] false are ignored: read as 0) and fills `view`
// and its byte range.  Rules (DESIGN.md): t and t->data not NULL; a known
// dtype; used strides >= 0; data aligned to the element size; address
// arithmetic that does not overflow; an output (is_output) in which no two
// indices reach the same element.
headsum_status CheckTensor(const char* fn, const char* name, const headsum_tensor* t,
                           const int64_t dims[4], const bool uses[3], bool is_output,
                           TensorView* view, ByteRange* range);
// An output's bytes must not meet an input's.
headsum_status CheckDisjoint(const char* fn, const char* out_name, const ByteRange& out,
                             const char* in_name, const ByteRange& in);

// Attention's operands on views: q, k, v and out, each against its
// extents, out against every input; fills views (and out's byte range).
headsum_status CheckAttnViews(const char* fn, const headsum_attn_shape* shape,
                              const AttnDims& a, const headsum_tensor* q,
                              const headsum_tensor* k, const headsum_tensor* v,
                              const headsum_tensor* out, AttnViews* views,
                              ByteRange* out_range = nullptr);
// headsum_attn_options checked (NULL: plain), into a->window, *opt and
// a->opt (null when nothing is added to the scores or denominators); the
// bias must not meet out_range (nor out_range2, when not null).
headsum_status CheckAttnOptions(const char* fn, const headsum_attn_options* options,
                                int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
                                const ByteRange* out_range, const ByteRange* out_range2,
                                AttnDims* a, AttnOptions* opt);

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_VALIDATE_H_
