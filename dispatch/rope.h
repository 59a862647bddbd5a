// Rotary position embedding (rotate-half) over the tokens of a call, on
// validated dimensions: the layer's one positional step (kernels/rope-inl.h).
#ifndef HEADSUM_DISPATCH_ROPE_H_
#define HEADSUM_DISPATCH_ROPE_H_

#include <stddef.h>

#include "headsum/headsum.h"

namespace headsum {
namespace dispatch {

// Tokens [B][S]; token (b, s) has `rows` rows of 2 * half floats, row r at
// x + (b * seq + s) * token_stride + r * row_stride, and sits at position
// pos0 + s.
struct RopeDims {
  size_t batch, seq;
  size_t rows, token_stride, row_stride;
  size_t half;
  size_t pos0;
};

// Rotates every row in place by its position's angles; table row p
// (table + p * 2 * half) holds [cos of half angles, sin of half angles] and
// exists for every position pos0 .. pos0 + seq - 1.
headsum_status RotateHalf(const RopeDims& d, float* x, const float* table);

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_ROPE_H_
