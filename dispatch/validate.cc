#include "dispatch/validate.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include <cmath>
#include <initializer_list>

namespace headsum {
namespace dispatch {
namespace {

thread_local char t_last_error[512] = "";

headsum_status CheckDim(const char* fn, const char* name, int64_t value) {
  if (value < 1) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "shape->%s = %" PRId64 " must be >= 1",
                name, value);
  }
  return HEADSUM_OK;
}

}  // namespace

headsum_status Fail(headsum_status status, const char* fn, const char* format, ...) {
  int n = snprintf(t_last_error, sizeof(t_last_error), "%s: ", fn);
  if (n < 0 || static_cast<size_t>(n) >= sizeof(t_last_error)) n = 0;
  va_list args;
  va_start(args, format);
  vsnprintf(t_last_error + n, sizeof(t_last_error) - static_cast<size_t>(n), format, args);
  va_end(args);
  return status;
}

void ClearError() { t_last_error[0] = '\0'; }
const char* LastError() { return t_last_error; }

headsum_status CheckPointer(const char* fn, const char* name, const void* p) {
  if (p == nullptr) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "%s is NULL", name);
  }
  return HEADSUM_OK;
}

headsum_status CheckElements(const char* fn, const char* name, uint64_t* count, int64_t a,
                             int64_t b, int64_t c, int64_t d) {
  uint64_t n = 1;
  bool overflow = false;
  for (int64_t factor : {a, b, c, d}) {
    overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(factor), &n);
  }
  if (overflow || n > kMaxElements) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "%s would hold %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                " elements, more than the %" PRIu64 " a tensor may hold",
                name, a, b, c, d, kMaxElements);
  }
  *count = n;
  return HEADSUM_OK;
}

headsum_status CheckAttnShape(const char* fn, const headsum_attn_shape* shape,
                              AttnDims* dims) {
  if (headsum_status s = CheckPointer(fn, "shape", shape)) return s;
  if (headsum_status s = CheckDim(fn, "batch", shape->batch)) return s;
  if (headsum_status s = CheckDim(fn, "heads", shape->heads)) return s;
  if (headsum_status s = CheckDim(fn, "seq_q", shape->seq_q)) return s;
  if (headsum_status s = CheckDim(fn, "seq_kv", shape->seq_kv)) return s;
  if (headsum_status s = CheckDim(fn, "head_dim", shape->head_dim)) return s;
  if (shape->kv_heads < 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "shape->kv_heads = %" PRId64 " must be >= 0 (0 means = heads)",
                shape->kv_heads);
  }
  const int64_t kv_heads = shape->kv_heads == 0 ? shape->heads : shape->kv_heads;
  if (shape->heads % kv_heads != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "shape->kv_heads = %" PRId64 " does not divide shape->heads = %" PRId64,
                kv_heads, shape->heads);
  }
  if (!std::isfinite(shape->scale)) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "shape->scale = %g is not finite",
                static_cast<double>(shape->scale));
  }
  // Every tensor a kernel may touch must be addressable.
  uint64_t n;
  if (headsum_status s = CheckElements(fn, "q/out [B][H][Sq][L]", &n, shape->batch,
                                       shape->heads, shape->seq_q, shape->head_dim))
    return s;
  if (headsum_status s = CheckElements(fn, "k/v [B][Hkv][Skv][L]", &n, shape->batch,
                                       kv_heads, shape->seq_kv, shape->head_dim))
    return s;
  if (headsum_status s = CheckElements(fn, "scores [B][H][Sq][Skv]", &n, shape->batch,
                                       shape->heads, shape->seq_q, shape->seq_kv))
    return s;
  dims->batch = static_cast<size_t>(shape->batch);
  dims->heads = static_cast<size_t>(shape->heads);
  dims->kv_heads = static_cast<size_t>(kv_heads);
  dims->seq_q = static_cast<size_t>(shape->seq_q);
  dims->seq_kv = static_cast<size_t>(shape->seq_kv);
  dims->head_dim = static_cast<size_t>(shape->head_dim);
  dims->scale = shape->scale != 0.0f
                    ? shape->scale
                    : static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape->head_dim)));
  dims->causal = shape->causal != 0;
  return HEADSUM_OK;
}

headsum_status CheckProjShape(const char* fn, const headsum_proj_shape* shape,
                              ProjDims* dims) {
  if (headsum_status s = CheckPointer(fn, "shape", shape)) return s;
  if (headsum_status s = CheckDim(fn, "batch", shape->batch)) return s;
  if (headsum_status s = CheckDim(fn, "seq", shape->seq)) return s;
  if (headsum_status s = CheckDim(fn, "heads", shape->heads)) return s;
  if (headsum_status s = CheckDim(fn, "head_dim", shape->head_dim)) return s;
  if (headsum_status s = CheckDim(fn, "model_dim", shape->model_dim)) return s;
  uint64_t n;
  if (headsum_status s = CheckElements(fn, "heads [B][H][S][L]", &n, shape->batch,
                                       shape->heads, shape->seq, shape->head_dim))
    return s;
  if (headsum_status s = CheckElements(fn, "wo [H*L][D]", &n, shape->heads,
                                       shape->head_dim, shape->model_dim))
    return s;
  if (headsum_status s = CheckElements(fn, "y [B][S][D]", &n, shape->batch, shape->seq,
                                       shape->model_dim))
    return s;
  dims->batch = static_cast<size_t>(shape->batch);
  dims->seq = static_cast<size_t>(shape->seq);
  dims->heads = static_cast<size_t>(shape->heads);
  dims->head_dim = static_cast<size_t>(shape->head_dim);
  dims->model_dim = static_cast<size_t>(shape->model_dim);
  return HEADSUM_OK;
}

}  // namespace dispatch
}  // namespace headsum
