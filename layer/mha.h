// The whole attention layer and its KV cache (headsum_mha_*,
// headsum_kv_cache_*), composed from the public calls: no kernel of its own
// besides the rotary embedding's dispatch op.  The MPI library (mpi/) runs
// the same checks and forward around its all-reduce.
#ifndef HEADSUM_LAYER_MHA_H_
#define HEADSUM_LAYER_MHA_H_

#include <stdint.h>

#include "headsum/headsum.h"

namespace headsum {
namespace layer {

// Every check of headsum_mha_forward, naming `fn` in the message; nothing
// is written.
headsum_status CheckForward(const char* fn, const headsum_mha* mha,
                            const headsum_kv_cache* cache, int64_t batch, int64_t seq,
                            const float* x, const float* y);
// The forward itself, on arguments CheckForward accepted.
headsum_status Forward(const char* fn, const headsum_mha* mha, headsum_kv_cache* cache,
                       int64_t batch, int64_t seq, const float* x, float* y);
// Elements of y: batch * seq * model_dim.
int64_t OutputElements(const headsum_mha* mha, int64_t batch, int64_t seq);

}  // namespace layer
}  // namespace headsum

#endif  // HEADSUM_LAYER_MHA_H_
