// The oneDNN reference paths: concat-then-GEMM projection and a composed
// attention (batched matmul with the scale, softmax, batched matmul; causal
// through a full-size additive mask).  Arguments arrive validated.
#ifndef HEADSUM_KERNELS_ONEDNN_ONEDNN_REF_H_
#define HEADSUM_KERNELS_ONEDNN_ONEDNN_REF_H_

#include <stdint.h>

#include <string>

#include "headsum/headsum.h"
#include "kernels/shapes.h"

namespace headsum {
namespace onednn {

// y[B][S][D] = concat_h(O_h)[B][S][H*L] @ wo[H*L][D] (+ bias[D]).
headsum_status ConcatProject(const ProjDims& p, const float* heads, const float* wo,
                             const float* bias, float* y, int num_threads);
// scores[B][H][Sq][Skv] = scale * Q K^T, -inf where causally masked.
headsum_status QkScores(const AttnDims& a, const float* q, const float* k, float* scores,
                        int num_threads);
// out[B][H][Sq][L] = softmax(scores (+ causal mask)) V.
headsum_status SoftmaxV(const AttnDims& a, const float* scores, const float* v, float* out,
                        int num_threads);
// out = softmax(scale Q K^T + mask) V, composed from oneDNN primitives.
headsum_status Attention(const AttnDims& a, const float* q, const float* k, const float* v,
                         float* out, int num_threads);
// The same over a KV cache that holds room for kv_capacity >= a.seq_kv
// tokens per kv head: K and V are [B][Hkv][kv_capacity][L] of which only the
// first a.seq_kv tokens of each head are read (the rest may hold anything,
// NaN included).  kv_capacity = a.seq_kv is the contiguous Attention above.
// Not in the C API: the layer benchmark's oneDNN-composed generation loop
// uses it to attend over its growing cache in place.
headsum_status Attention(const AttnDims& a, size_t kv_capacity, const float* q, const float* k,
                         const float* v, float* out, int num_threads);

// Which oneDNN implementation serves each step at this shape and thread
// count (impl_info_str, e.g. "brg:avx512_core"; "ref:any" would mean oneDNN's
// slow fallback): "qk_matmul=... softmax=... pv_matmul=... project_matmul=...".
// For benchmark context; creates (and caches) the primitives; never throws.
std::string DescribeImpls(const AttnDims& a, const ProjDims& p, int num_threads);

// bf16 twins of the native paths (onednn_bf16.cc), contiguous bf16 operands
// (u16 bits): out [B][H][Sq][L] = softmax(scale Q K^T + mask) V composed
// from bf16 matmuls (S f32, P bf16); y = concat(O) @ Wo (+ bias) in f32.
// impls (may be null) receives the oneDNN implementation names.
// UNSUPPORTED when oneDNN has no implementation here.
headsum_status AttentionBf16(const AttnDims& a, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, uint16_t* out, int num_threads,
                             std::string* impls);
headsum_status ConcatProjectBf16(const ProjDims& p, const uint16_t* heads, const uint16_t* wo,
                                 const float* bias, float* y, int num_threads,
                                 std::string* impls);

// What this thread's last failing call above caught (oneDNN's message, "out
// of memory", ...), for headsum_last_error(); valid until the next failure.
const char* LastErrorDetail();

}  // namespace onednn
}  // namespace headsum

#endif  // HEADSUM_KERNELS_ONEDNN_ONEDNN_REF_H_
