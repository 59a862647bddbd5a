// TEMPORARY: an f32-only stand-in for the tensor API (headsum_convert,
// headsum_attention_tensors, headsum_wo_pack_tensor,
// headsum_project_heads_sum_packed_tensors) until its implementation lands
// on main; this file is deleted by that merge.  Gathers views into
// contiguous buffers and calls the plain f32 entry points.  16-bit dtypes:
// HEADSUM_ERR_UNSUPPORTED.
#include <string.h>

#include <vector>

#include "dispatch/validate.h"
#include "headsum/headsum.h"

using headsum::dispatch::Fail;

namespace {

bool AllF32(std::initializer_list<const headsum_tensor*> ts) {
  for (const headsum_tensor* t : ts) {
    if (t == nullptr || t->data == nullptr || t->dtype != HEADSUM_F32) return false;
  }
  return true;
}

float* At(const headsum_tensor& t, int64_t b, int64_t h, int64_t s) {
  return static_cast<float*>(t.data) + b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
}

void Gather(const headsum_tensor& t, int64_t B, int64_t H, int64_t S, int64_t L,
            std::vector<float>* out) {
  out->resize(size_t(B * H * S * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        memcpy(out->data() + ((b * H + h) * S + s) * L, At(t, b, h, s), size_t(L) * 4);
}

void Scatter(const std::vector<float>& in, int64_t B, int64_t H, int64_t S, int64_t L,
             const headsum_tensor& t) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        memcpy(At(t, b, h, s), in.data() + ((b * H + h) * S + s) * L, size_t(L) * 4);
}

headsum_status NotYet(const char* fn) {
  return Fail(HEADSUM_ERR_UNSUPPORTED, fn, "16-bit tensors: the tensor API is not merged yet");
}

}  // namespace

extern "C" {

headsum_status headsum_convert(const int64_t dims[4], const headsum_tensor* src,
                               const headsum_tensor* dst) {
  if (!AllF32({src, dst})) return NotYet("headsum_convert");
  std::vector<float> tmp;
  Gather(*src, dims[0], dims[1], dims[2], dims[3], &tmp);
  Scatter(tmp, dims[0], dims[1], dims[2], dims[3], *dst);
  return HEADSUM_OK;
}

headsum_status headsum_attention_tensors(const headsum_attn_shape* shape,
                                         const headsum_tensor* q, const headsum_tensor* k,
                                         const headsum_tensor* v, const headsum_tensor* out) {
  if (!AllF32({q, k, v, out})) return NotYet("headsum_attention_tensors");
  const int64_t Hkv = shape->kv_heads == 0 ? shape->heads : shape->kv_heads;
  std::vector<float> cq, ck, cv, co;
  Gather(*q, shape->batch, shape->heads, shape->seq_q, shape->head_dim, &cq);
  Gather(*k, shape->batch, Hkv, shape->seq_kv, shape->head_dim, &ck);
  Gather(*v, shape->batch, Hkv, shape->seq_kv, shape->head_dim, &cv);
  co.resize(cq.size());
  headsum_status s = headsum_attention(shape, cq.data(), ck.data(), cv.data(), co.data());
  if (s) return s;
  Scatter(co, shape->batch, shape->heads, shape->seq_q, shape->head_dim, *out);
  return HEADSUM_OK;
}

headsum_status headsum_wo_pack_tensor(const headsum_proj_shape* shape, const headsum_tensor* wo,
                                      headsum_wo_packed** packed) {
  if (!AllF32({wo})) return NotYet("headsum_wo_pack_tensor");
  std::vector<float> w;
  const int64_t rows = shape->heads * shape->head_dim;
  Gather(*wo, 1, 1, rows, shape->model_dim, &w);
  return headsum_wo_pack(shape, w.data(), packed);
}

headsum_status headsum_project_heads_sum_packed_tensors(const headsum_proj_shape* shape,
                                                        const headsum_tensor* heads,
                                                        const headsum_wo_packed* wo,
                                                        const float* bias,
                                                        const headsum_tensor* y) {
  if (!AllF32({heads, y})) return NotYet("headsum_project_heads_sum_packed_tensors");
  std::vector<float> o, out(size_t(shape->batch * shape->seq * shape->model_dim));
  Gather(*heads, shape->batch, shape->heads, shape->seq, shape->head_dim, &o);
  headsum_status s = headsum_project_heads_sum_packed(shape, o.data(), wo, bias, out.data());
  if (s) return s;
  Scatter(out, shape->batch, 1, shape->seq, shape->model_dim, *y);
  return HEADSUM_OK;
}

}  // extern "C"
