#include "dispatch/validate.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include <string.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "dispatch/entry.h"

namespace headsum {
namespace dispatch {
namespace {

thread_local char t_last_error[512] = "";

struct ShapeDim {
  const char* name;  // the field of the shape
  int64_t value;
};

// Each of a shape's dims, in order, >= 1.
headsum_status CheckDims(const char* fn, std::initializer_list<ShapeDim> dims) {
  for (const ShapeDim& d : dims) {
    if (d.value < 1) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "shape->%s = %" PRId64 " must be >= 1",
                  d.name, d.value);
    }
  }
  return HEADSUM_OK;
}

// A tensor's extents, for CheckElements.
struct Extents {
  const char* name;
  int64_t a, b, c, d;
};

// Each tensor, in order, addressable (see CheckElements).
headsum_status CheckAddressable(const char* fn, std::initializer_list<Extents> tensors) {
  uint64_t n;
  for (const Extents& t : tensors) {
    HEADSUM_CHECK(CheckElements(fn, t.name, &n, t.a, t.b, t.c, t.d));
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

headsum_status CheckAtLeastOne(const char* fn, const char* name, int64_t value) {
  if (value >= 1) return HEADSUM_OK;
  return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "%s = %" PRId64 " must be >= 1", name, value);
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
  HEADSUM_CHECK(CheckPointer(fn, "shape", shape));
  HEADSUM_CHECK(CheckDims(fn, {{"batch", shape->batch}, {"heads", shape->heads},
                               {"seq_q", shape->seq_q}, {"seq_kv", shape->seq_kv},
                               {"head_dim", shape->head_dim}}));
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
  HEADSUM_CHECK(CheckAddressable(
      fn, {{"q/out [B][H][Sq][L]", shape->batch, shape->heads, shape->seq_q, shape->head_dim},
           {"k/v [B][Hkv][Skv][L]", shape->batch, kv_heads, shape->seq_kv, shape->head_dim},
           {"scores [B][H][Sq][Skv]", shape->batch, shape->heads, shape->seq_q, shape->seq_kv}}));
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
  HEADSUM_CHECK(CheckPointer(fn, "shape", shape));
  HEADSUM_CHECK(CheckDims(fn, {{"batch", shape->batch}, {"seq", shape->seq},
                               {"heads", shape->heads}, {"head_dim", shape->head_dim},
                               {"model_dim", shape->model_dim}}));
  HEADSUM_CHECK(CheckAddressable(
      fn, {{"heads [B][H][S][L]", shape->batch, shape->heads, shape->seq, shape->head_dim},
           {"wo [H*L][D]", shape->heads, shape->head_dim, shape->model_dim, 1},
           {"y [B][S][D]", shape->batch, shape->seq, shape->model_dim, 1}}));
  dims->batch = static_cast<size_t>(shape->batch);
  dims->seq = static_cast<size_t>(shape->seq);
  dims->heads = static_cast<size_t>(shape->heads);
  dims->head_dim = static_cast<size_t>(shape->head_dim);
  dims->model_dim = static_cast<size_t>(shape->model_dim);
  return HEADSUM_OK;
}

headsum_status CheckTensor(const char* fn, const char* name, const headsum_tensor* t,
                           const int64_t dims[4], const bool uses[3], bool is_output,
                           TensorView* view, ByteRange* range) {
  if (t == nullptr) return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "%s is NULL", name);
  if (t->data == nullptr) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "%s->data is NULL", name);
  }
  // The field may hold any int (a C caller can store one): read it as one.
  int dtype_value;
  static_assert(sizeof(t->dtype) == sizeof(int), "headsum_dtype is an int");
  memcpy(&dtype_value, &t->dtype, sizeof(int));
  if (dtype_value != HEADSUM_F32 && dtype_value != HEADSUM_F16 && dtype_value != HEADSUM_BF16) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "%s->dtype = %d is no headsum_dtype (HEADSUM_F32 = 0, HEADSUM_F16 = 1, "
                "HEADSUM_BF16 = 2)", name, dtype_value);
  }
  const DType dtype = static_cast<DType>(dtype_value);
  const uint64_t bytes = DTypeBytes(dtype);
  static const char* kIndex[3] = {"b", "h", "s"};
  uint64_t strides[4] = {0, 0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    if (!uses[i]) continue;
    if (t->strides[i] < 0) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                  "%s->strides[%d] (%s) = %" PRId64 " is negative", name, i, kIndex[i],
                  t->strides[i]);
    }
    strides[i] = static_cast<uint64_t>(t->strides[i]);
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data);
  if (base % bytes != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "%s->data = %p is not aligned to its element size (%" PRIu64 " bytes)", name,
                t->data, bytes);
  }
  // Highest element offset: sum_i (dims_i - 1) strides_i, then in bytes.
  uint64_t last = 0;
  bool overflow = false;
  for (int i = 0; i < 4; ++i) {
    uint64_t term;
    overflow |= __builtin_mul_overflow(static_cast<uint64_t>(dims[i] - 1), strides[i], &term);
    overflow |= __builtin_add_overflow(last, term, &last);
  }
  uint64_t span;  // bytes from data to the end of the last element
  overflow |= __builtin_mul_overflow(last, bytes, &span);
  overflow |= __builtin_add_overflow(span, bytes, &span);
  uintptr_t end;
  overflow |= span > static_cast<uint64_t>(PTRDIFF_MAX) ||
              __builtin_add_overflow(base, static_cast<uintptr_t>(span), &end);
  if (overflow) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "%s: strides {%" PRId64 ", %" PRId64 ", %" PRId64 "} over [%" PRId64
                "][%" PRId64 "][%" PRId64 "][%" PRId64
                "] overflow the address arithmetic (the view would pass PTRDIFF_MAX bytes "
                "or the end of the address space)",
                name, uses[0] ? t->strides[0] : 0, uses[1] ? t->strides[1] : 0,
                uses[2] ? t->strides[2] : 0, dims[0], dims[1], dims[2], dims[3]);
  }
  if (is_output) {
    // Injective when the strides nest: in increasing order, each is larger
    // than the span of the smaller ones (indices of extent 1 take no part).
    struct Axis { uint64_t stride, extent; int index; };
    Axis axes[4];
    int n = 0;
    for (int i = 0; i < 4; ++i) {
      if (dims[i] > 1) axes[n++] = {strides[i], static_cast<uint64_t>(dims[i]), i};
    }
    std::sort(axes, axes + n, [](const Axis& x, const Axis& y) {
      return x.stride != y.stride ? x.stride < y.stride : x.index > y.index;
    });
    uint64_t inner = 0;  // largest offset the smaller strides reach
    bool nested = true;
    for (int i = 0; i < n && nested; ++i) {
      nested = axes[i].stride > inner;
      inner += (axes[i].extent - 1) * axes[i].stride;
    }
    if (!nested) {
      // Strides that do not nest can still be injective (interleaved
      // layouts): look for two indices that meet, i.e. a nonzero d with
      // |d_i| < extent_i and sum_i d_i stride_i = 0, by enumerating d over
      // every axis but the largest-stride one and solving for that one.
      uint64_t cases = 1;
      for (int i = 0; i + 1 < n; ++i) {
        if (__builtin_mul_overflow(cases, 2 * axes[i].extent - 1, &cases)) cases = UINT64_MAX;
      }
      constexpr uint64_t kMaxCases = uint64_t{1} << 22;
      if (cases > kMaxCases) {
        return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                    "%s is an output whose strides do not nest (each larger than the span of "
                    "the smaller ones) and whose indices are too many to show that no two "
                    "reach the same element", name);
      }
      int64_t d[4] = {0, 0, 0, 0};
      for (int i = 0; i + 1 < n; ++i) d[i] = -static_cast<int64_t>(axes[i].extent - 1);
      const Axis& last = axes[n - 1];
      for (uint64_t c = 0; c < cases; ++c) {
        __int128 sum = 0;
        bool zero = true;
        for (int i = 0; i + 1 < n; ++i) {
          sum += static_cast<__int128>(d[i]) * axes[i].stride;
          zero &= d[i] == 0;
        }
        // d_last * stride_last = -sum with |d_last| < extent_last, d != 0.
        bool meet;
        int64_t d_last = 0;
        if (last.stride == 0) {
          meet = sum == 0;  // (zero: d_last = 1 also meets, extent > 1)
          d_last = zero ? 1 : 0;
        } else {
          const __int128 q = -sum / static_cast<__int128>(last.stride);
          meet = -sum % static_cast<__int128>(last.stride) == 0 &&
                 q < static_cast<__int128>(last.extent) &&
                 -q < static_cast<__int128>(last.extent) && !(zero && q == 0);
          d_last = static_cast<int64_t>(q);
        }
        if (meet) {
          // Two indices that meet: (b, h, s, l) with the differences d
          // split into their positive and negative parts.
          int64_t one[4] = {0, 0, 0, 0}, two[4] = {0, 0, 0, 0};
          for (int i = 0; i < n; ++i) {
            const int64_t di = i + 1 < n ? d[i] : d_last;
            const int at = axes[i].index;
            if (di > 0) {
              one[at] = di;
            } else {
              two[at] = -di;
            }
          }
          return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                      "%s is an output in which two indices reach the same element: "
                      "(b, h, s, l) = (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                      ") and (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                      ") with strides {%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", 1} over [%" PRId64
                      "][%" PRId64 "][%" PRId64 "][%" PRId64 "]",
                      name, one[0], one[1], one[2], one[3], two[0], two[1], two[2], two[3],
                      strides[0], strides[1], strides[2], dims[0], dims[1], dims[2], dims[3]);
        }
        for (int i = 0; i + 1 < n; ++i) {  // next d, odometer order
          if (d[i] < static_cast<int64_t>(axes[i].extent - 1)) {
            ++d[i];
            break;
          }
          d[i] = -static_cast<int64_t>(axes[i].extent - 1);
        }
      }
    }
  }
  view->data = t->data;
  view->dtype = dtype;
  view->sb = static_cast<size_t>(strides[0]);
  view->sh = static_cast<size_t>(strides[1]);
  view->ss = static_cast<size_t>(strides[2]);
  range->lo = base;
  range->hi = end - 1;
  return HEADSUM_OK;
}

headsum_status CheckDisjoint(const char* fn, const char* out_name, const ByteRange& out,
                             const char* in_name, const ByteRange& in) {
  if (!out.Meets(in)) return HEADSUM_OK;
  return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
              "output %s (bytes [%p, %p]) overlaps input %s (bytes [%p, %p])", out_name,
              reinterpret_cast<void*>(out.lo), reinterpret_cast<void*>(out.hi), in_name,
              reinterpret_cast<void*>(in.lo), reinterpret_cast<void*>(in.hi));
}

namespace {
constexpr bool kAllViewStrides[3] = {true, true, true};
}  // namespace

// Attention's operands on views, checked: q, k, v and out, each against its
// extents, out against every input.
headsum_status CheckAttnViews(const char* fn, const headsum_attn_shape* shape,
                              const AttnDims& a, const headsum_tensor* q,
                              const headsum_tensor* k, const headsum_tensor* v,
                              const headsum_tensor* out, AttnViews* views,
                              ByteRange* out_range_out) {
  const int64_t kv_heads = static_cast<int64_t>(a.kv_heads);
  const int64_t q_dims[4] = {shape->batch, shape->heads, shape->seq_q, shape->head_dim};
  const int64_t kv_dims[4] = {shape->batch, kv_heads, shape->seq_kv, shape->head_dim};
  ByteRange q_range, k_range, v_range, out_range;
  ByteRange& out_r = out_range_out != nullptr ? *out_range_out : out_range;
  HEADSUM_CHECK(CheckTensor(fn, "q", q, q_dims, kAllViewStrides, false, &views->q, &q_range));
  HEADSUM_CHECK(CheckTensor(fn, "k", k, kv_dims, kAllViewStrides, false, &views->k, &k_range));
  HEADSUM_CHECK(CheckTensor(fn, "v", v, kv_dims, kAllViewStrides, false, &views->v, &v_range));
  HEADSUM_CHECK(CheckTensor(fn, "out", out, q_dims, kAllViewStrides, true, &views->out, &out_r));
  HEADSUM_CHECK(CheckDisjoint(fn, "out", out_r, "q", q_range));
  HEADSUM_CHECK(CheckDisjoint(fn, "out", out_r, "k", k_range));
  return CheckDisjoint(fn, "out", out_r, "v", v_range);
}

// What a model adds to the scores, checked (DESIGN.md's rules, each named):
// window >= 0; softcap >= 0 and finite; slopes and sinks finite; the bias a
// view over [B][H][Sq][Skv] that does not meet out.
headsum_status CheckAttnOptions(const char* fn, const headsum_attn_options* options,
                                int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
                                const ByteRange* out_range, const ByteRange* out_range2,
                                AttnDims* a, AttnOptions* opt) {
  *opt = AttnOptions();
  a->window = 0;
  a->opt = nullptr;
  if (options == nullptr) return HEADSUM_OK;
  if (options->window < 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "options->window = %lld must be >= 0",
                static_cast<long long>(options->window));
  }
  if (!(options->softcap >= 0.0f) || !std::isfinite(options->softcap)) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "options->softcap = %g must be finite and >= 0", double(options->softcap));
  }
  const struct {
    const char* name;
    const float* values;
  } per_head[2] = {{"alibi_slopes", options->alibi_slopes}, {"sinks", options->sinks}};
  for (const auto& p : per_head) {
    for (int64_t h = 0; p.values != nullptr && h < heads; ++h) {
      if (!std::isfinite(p.values[h])) {
        return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                    "options->%s[%lld] = %g must be finite", p.name, static_cast<long long>(h),
                    double(p.values[h]));
      }
    }
  }
  if (options->bias != nullptr) {
    const int64_t dims[4] = {batch, heads, seq_q, seq_kv};
    ByteRange bias_range;
    HEADSUM_CHECK(CheckTensor(fn, "options->bias", options->bias, dims, kAllViewStrides, false,
                              &opt->bias, &bias_range));
    if (out_range != nullptr) {
      HEADSUM_CHECK(CheckDisjoint(fn, "out", *out_range, "options->bias", bias_range));
    }
    if (out_range2 != nullptr) {
      HEADSUM_CHECK(CheckDisjoint(fn, "out", *out_range2, "options->bias", bias_range));
    }
    opt->has_bias = true;
  }
  opt->softcap = options->softcap;
  opt->slopes = options->alibi_slopes;
  opt->sinks = options->sinks;
  a->window = static_cast<size_t>(options->window);
  if (opt->Scores() || opt->sinks != nullptr) a->opt = opt;
  return HEADSUM_OK;
}

}  // namespace dispatch
}  // namespace headsum
