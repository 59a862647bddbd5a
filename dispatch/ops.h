// The operations behind the public API, on validated dimensions: each picks
// the active target once, splits the work into items across threads and runs
// the target's kernel on each item.
#ifndef HEADSUM_DISPATCH_OPS_H_
#define HEADSUM_DISPATCH_OPS_H_

#include <stddef.h>
#include <stdint.h>

#include "headsum/headsum.h"
#include "kernels/shapes.h"

namespace headsum {
namespace dispatch {

headsum_status QkScores(const AttnDims& a, const float* q, const float* k, float* scores);
headsum_status SoftmaxV(const AttnDims& a, const float* scores, const float* v, float* out);
headsum_status Attention(const AttnDims& a, const float* q, const float* k, const float* v,
                         float* out);
// Attention on validated strided views of any dtype.
headsum_status Attention(const AttnDims& a, const AttnViews& views);

// A validated ragged batch over a paged cache (headsum_batch_shape,
// headsum_paged_kv): the per-sequence row offsets and key counts, the pools
// as views (k.sh, k.ss: the kv-head and slot strides; data: the pool) and
// the block table [batch][blocks_per_seq].
struct PagedBatch {
  size_t batch, heads, kv_heads, head_dim;
  float scale;  // resolved
  bool causal;
  const int64_t* q_offsets;
  const int64_t* kv_lens;
  TensorView k, v;
  const int32_t* block_table;
  size_t blocks_per_seq, block_rows, block_stride;  // tokens per block, elements between
};
// Each sequence's rows of q ([T][H][L] as a view with sh, ss) over its keys
// into out, with the window and options (opt null: none).
headsum_status AttentionPaged(const PagedBatch& p, size_t window, const AttnOptions* opt,
                              const TensorView& q, const TensorView& out);
// Each sequence's new K/V rows (views as q) into its last kv_lens[b] - n_b ..
// kv_lens[b] - 1 slots, converted to the pool's dtype.
headsum_status PagedKvWrite(const PagedBatch& p, const TensorView& k_new,
                            const TensorView& v_new);

// y and per_head may each be null (not both); bias, head_gates may be null.
headsum_status ProjectHeadsSum(const ProjDims& p, const float* heads, const float* wo,
                               const float* bias, const float* head_gates, float* y,
                               float* per_head);
// packed [D / kWoPanelCols panels][H*L][panel width] (kernels/shapes.h).
headsum_status PackWo(const ProjDims& p, const float* wo, float* packed);

// Wo as the chained sum reads it: rows of [H*L][D] `stride` elements apart,
// or packed panels (headsum_wo_pack), in its dtype.
struct WoSource {
  const void* data;
  DType dtype;
  size_t stride;  // elements between rows (unpacked)
  bool packed;
  // A packed handle's native bf16 panels (dispatch/native_ops.h), if any.
  const uint16_t* native = nullptr;
};
// packed: Wo's panels in its own dtype.
headsum_status PackWo(const ProjDims& p, const WoSource& wo, void* packed);
// Y = bias + sum_h O_h Wo[h] on views (O [B][H][S][L], Y [B][S][D] with
// its b and s strides) of any dtype.
headsum_status ChainedSum(const ProjDims& p, const TensorView& heads, const WoSource& wo,
                          const float* bias, const TensorView& y);
inline TensorView ContiguousYF32(const ProjDims& p, float* y) {
  TensorView t;
  t.data = y;
  t.dtype = DType::kF32;
  t.sb = p.seq * p.model_dim;
  t.sh = 0;
  t.ss = p.model_dim;
  return t;
}
// Y = bias + sum_h O_h Wo[h] from packed Wo: the same arithmetic (bitwise)
// as ProjectHeadsSum with every gate 1 and no per-head output.
headsum_status ProjectHeadsSumPacked(const ProjDims& p, const float* heads,
                                     const float* packed_wo, const float* bias, float* y);
headsum_status HeadAttribution(const ProjDims& p, const float* heads, const float* wo,
                               const float* directions, size_t n_directions, float* out);
// wd[h][r][l] = Wo[h*L + l] . directions[r]   ([H][R][L]).
headsum_status ProjectWeightsOntoDirections(const ProjDims& p, const float* wo,
                                           const float* directions, size_t n_directions,
                                           float* wd);
// out[b][s][h][r] = O_h[s] . wd[h][r].
headsum_status AttributionFromBasis(const ProjDims& p, const float* heads, const float* wd,
                                    size_t n_directions, float* out);
headsum_status HeadContributionNorms(const ProjDims& p, const float* heads, const float* wo,
                                     float* out);

// dst = src over [dims[0]][dims[1]][dims[2]][dims[3]], rounded to dst's dtype.
headsum_status Convert(const size_t dims[4], const TensorView& src, const TensorView& dst);

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_OPS_H_
