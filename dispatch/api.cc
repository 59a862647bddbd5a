// The C API: every call checks its arguments once, here (dispatch/entry.h),
// then hands the validated dimensions to dispatch/ops (or the oneDNN
// reference).
#include <stdio.h>

#include <memory>
#include <new>
#include <vector>

#include "dispatch/entry.h"
#include "dispatch/native_ops.h"
#include "dispatch/ops.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"
#include "dispatch/validate.h"
#include "headsum/headsum.h"
#include "dispatch/test_hooks.h"
#include "hwy/aligned_allocator.h"
#include "hwy/targets.h"
#include "kernels/native/native.h"
#include "kernels/shapes.h"
#ifdef HEADSUM_HAVE_ONEDNN
#include "kernels/onednn/onednn_ref.h"
#endif

using headsum::AttnDims;
using headsum::ProjDims;
using namespace headsum::dispatch;

#ifndef HEADSUM_VERSION_STRING
#define HEADSUM_VERSION_STRING "0.0.0"
#endif

#ifdef HEADSUM_HAVE_ONEDNN
// A oneDNN reference call ends an entry point as a dispatch op does.
#define HEADSUM_ONEDNN(call) Run([&] { return headsum::onednn::call; })
#else
// Without oneDNN the reference entry points check their arguments all the
// same, then refuse.
#define HEADSUM_ONEDNN(call)       \
  Refuse(HEADSUM_ERR_UNSUPPORTED, \
         "this build has no oneDNN reference (HEADSUM_WITH_ONEDNN=OFF)")
#endif

namespace {

// project_heads_sum_ex's outputs: one at least; per_head [B][S][H][D]
// addressable when it is there.
headsum_status CheckPerHeadOutputs(const char* fn, const headsum_proj_shape* shape,
                                   const float* y, const float* per_head) {
  if (y == nullptr && per_head == nullptr) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "y and per_head are both NULL: at least one output is needed");
  }
  if (per_head == nullptr) return HEADSUM_OK;
  uint64_t n;
  return CheckElements(fn, "per_head [B][S][H][D]", &n, shape->batch, shape->seq, shape->heads,
                       shape->model_dim);
}

// An attribution's directions [R][D]: R >= 1, addressable.
headsum_status CheckDirections(const char* fn, const headsum_proj_shape* shape,
                               int64_t n_directions) {
  HEADSUM_CHECK(CheckAtLeastOne(fn, "n_directions", n_directions));
  uint64_t n;
  return CheckElements(fn, "directions [R][D]", &n, n_directions, shape->model_dim);
}

// An attribution's out [B][S][H][R], addressable.
headsum_status CheckAttributionOut(const char* fn, const headsum_proj_shape* shape,
                                   int64_t n_directions) {
  uint64_t n;
  return CheckElements(fn, "out [B][S][H][R]", &n, shape->batch, shape->seq, shape->heads,
                       n_directions);
}

}  // namespace

extern "C" {

const char* headsum_version(void) { return HEADSUM_VERSION_STRING; }

const char* headsum_last_error(void) { return LastError(); }

const char* headsum_active_target(void) { return ActiveTargetName(); }

int headsum_compiled_targets(const char** names, int capacity) {
  // The native bf16 paths first (best first), then Highway's targets.
  std::vector<const char*> all;
  for (const headsum::native::Path* const* p = headsum::native::CompiledPaths(); *p; ++p) {
    all.push_back((*p)->name);
  }
  for (int64_t t : CompiledTargets()) all.push_back(hwy::TargetName(t));
  for (int i = 0; names != nullptr && i < capacity && i < static_cast<int>(all.size()); ++i) {
    names[i] = all[static_cast<size_t>(i)];
  }
  return static_cast<int>(all.size());
}

headsum_status headsum_set_target(const char* name) {
  static const char* fn = "headsum_set_target";
  if (name == nullptr) {
    ResetActiveTarget();
    return HEADSUM_OK;
  }
  if (const headsum::native::Path* native = headsum::native::PathByName(name)) {
    if (!SetActiveNative(native)) {
      return Fail(HEADSUM_ERR_UNSUPPORTED, fn, "name = \"%s\": this CPU cannot run it", name);
    }
    return HEADSUM_OK;
  }
  const int64_t target = TargetFromName(name);
  if (target == 0) {
    return Fail(HEADSUM_ERR_UNSUPPORTED, fn, "name = \"%.64s\" is no target this build compiled",
                name);
  }
  if (!SetActiveTarget(target)) {
    return Fail(HEADSUM_ERR_UNSUPPORTED, fn, "name = \"%s\": this CPU cannot run it", name);
  }
  return HEADSUM_OK;
}

headsum_status headsum_set_fpmath(int mode) {
  if (mode != HEADSUM_FPMATH_STRICT && mode != HEADSUM_FPMATH_BF16) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, "headsum_set_fpmath",
                "mode = %d is none of HEADSUM_FPMATH_STRICT (0), HEADSUM_FPMATH_BF16 (1)", mode);
  }
  SetFpMath(mode);
  return HEADSUM_OK;
}

int headsum_get_fpmath(void) { return FpMath(); }

headsum_status headsum_set_num_threads(int n) {
  if (n < 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, "headsum_set_num_threads",
                "n = %d must be >= 0 (0 means the default)", n);
  }
  SetNumThreads(n);
  return HEADSUM_OK;
}

headsum_status headsum_qk_scores(const headsum_attn_shape* shape, const float* q,
                                 const float* k, float* scores) {
  AttnDims a;
  return Entry("headsum_qk_scores")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"q", q}, {"k", k}, {"scores", scores}})
      .Run([&] { return QkScores(a, q, k, scores); });
}

headsum_status headsum_softmax_v(const headsum_attn_shape* shape, const float* scores,
                                 const float* v, float* out) {
  AttnDims a;
  return Entry("headsum_softmax_v")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"scores", scores}, {"v", v}, {"out", out}})
      .Run([&] { return SoftmaxV(a, scores, v, out); });
}

headsum_status headsum_attention(const headsum_attn_shape* shape, const float* q,
                                 const float* k, const float* v, float* out) {
  AttnDims a;
  return Entry("headsum_attention")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"q", q}, {"k", k}, {"v", v}, {"out", out}})
      .Run([&] { return Attention(a, q, k, v, out); });
}

headsum_status headsum_project_heads_sum(const headsum_proj_shape* shape, const float* heads,
                                         const float* wo, const float* bias, float* y) {
  ProjDims p;
  return Entry("headsum_project_heads_sum")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}, {"y", y}})
      .Run([&] { return ProjectHeadsSum(p, heads, wo, bias, nullptr, y, nullptr); });
}

headsum_status headsum_project_heads_sum_ex(const headsum_proj_shape* shape,
                                            const float* heads, const float* wo,
                                            const float* bias, const float* head_gates,
                                            float* y, float* per_head) {
  ProjDims p;
  return Entry("headsum_project_heads_sum_ex")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}})
      .Check(CheckPerHeadOutputs, shape, y, per_head)
      .Run([&] { return ProjectHeadsSum(p, heads, wo, bias, head_gates, y, per_head); });
}

headsum_status headsum_head_attribution(const headsum_proj_shape* shape, const float* heads,
                                        const float* wo, const float* directions,
                                        int64_t n_directions, float* out) {
  ProjDims p;
  return Entry("headsum_head_attribution")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}, {"directions", directions}, {"out", out}})
      .Check(CheckDirections, shape, n_directions)
      .Check(CheckAttributionOut, shape, n_directions)
      .Check([&](const char* fn) {
        uint64_t n;
        return CheckElements(fn, "Wo directions^T [H][R][L]", &n, shape->heads, shape->head_dim,
                             n_directions);
      })
      .Run([&] {
        return HeadAttribution(p, heads, wo, directions, static_cast<size_t>(n_directions), out);
      });
}

}  // extern "C"

// The dims a weight handle was made for.
struct WeightDims {
  int64_t heads, head_dim, model_dim;
};

struct headsum_wo_packed : WeightDims {
  hwy::AlignedFreeUniquePtr<float[]> data;  // panels, kernels/shapes.h: kWoPanelCols
  headsum::DType dtype = headsum::DType::kF32;  // of the panels' elements
  // The native bf16 panels (dispatch/native_ops.h), made at pack time when a
  // native path was in force and the call would take it (bf16 Wo, or any
  // under fpmath BF16); null otherwise.
  hwy::AlignedFreeUniquePtr<float[]> native;
  const uint16_t* native_panels() const {
    return reinterpret_cast<const uint16_t*>(native.get());
  }
};

struct headsum_attribution_basis : WeightDims {
  int64_t n_directions;
  hwy::AlignedFreeUniquePtr<float[]> data;  // Wo directions^T, [H][R][L]
};

namespace {

using headsum::DType;
using headsum::TensorView;

// Hands out a new weight handle (packed Wo, attribution basis): `made` and
// its data come from allocations that return null when memory is short;
// fill(data) computes the contents.  On any failure the handle is freed and
// *out is left as it was.
template <class Handle, class Fill>
headsum_status HandOut(const char* fn, const char* what, Handle* made, const Fill& fill,
                       Handle** out) {
  std::unique_ptr<Handle> owned(made);
  if (!owned || !owned->data) {
    return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for %s", what);
  }
  HEADSUM_CHECK(Reported(fn, fill(owned->data.get())));
  *out = owned.release();
  return HEADSUM_OK;
}

// A packed Wo's native panels, when a call on this handle would take a
// native path (see headsum_wo_packed::native).
headsum_status AddNativePanels(const char* fn, const ProjDims& p, const TensorView& wo,
                               headsum_wo_packed* made) {
  if (made == nullptr) return HEADSUM_OK;  // HandOut reports it
  const headsum::native::Path* n = NativeFor({wo.dtype});
  if (n == nullptr) return HEADSUM_OK;
  made->native = NativePackWo(*n, p, wo);
  if (!made->native) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for the packed Wo");
  return HEADSUM_OK;
}

// Hands out a packed Wo of `wo` (panels in its dtype, pack(panels) fills
// them) with its native panels.
template <class Pack>
headsum_status HandOutPackedWo(const char* fn, const headsum_proj_shape* shape, const ProjDims& p,
                               const TensorView& wo, const Pack& pack,
                               headsum_wo_packed** packed) {
  const size_t elements = p.inner() * p.model_dim;
  const size_t floats = wo.dtype == DType::kF32 ? elements : (elements + 1) / 2;
  auto* made = new (std::nothrow) headsum_wo_packed{
      {shape->heads, shape->head_dim, shape->model_dim}, AllocateFloats(floats), wo.dtype};
  if (headsum_status st = AddNativePanels(fn, p, wo, made)) {
    delete made;
    return st;
  }
  return HandOut(fn, "the packed Wo", made, pack, packed);
}

// The shape a handle was made for against the shape of a call.
headsum_status CheckSameWeights(const char* fn, const char* what,
                                const headsum_proj_shape* shape, const WeightDims* made) {
  if (shape->heads == made->heads && shape->head_dim == made->head_dim &&
      shape->model_dim == made->model_dim) {
    return HEADSUM_OK;
  }
  return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
              "shape (heads = %lld, head_dim = %lld, model_dim = %lld) does not match the "
              "%s (heads = %lld, head_dim = %lld, model_dim = %lld)",
              static_cast<long long>(shape->heads), static_cast<long long>(shape->head_dim),
              static_cast<long long>(shape->model_dim), what,
              static_cast<long long>(made->heads), static_cast<long long>(made->head_dim),
              static_cast<long long>(made->model_dim));
}

}  // namespace

extern "C" {

headsum_status headsum_wo_pack(const headsum_proj_shape* shape, const float* wo,
                               headsum_wo_packed** packed) {
  ProjDims p;
  return Entry("headsum_wo_pack")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"wo", wo}, {"packed", packed}})
      .RunReporting([&](const char* fn) {
        return HandOutPackedWo(
            fn, shape, p, headsum::ContiguousF32(wo, 1, p.inner(), p.model_dim),
            [&](float* panels) { return PackWo(p, wo, panels); }, packed);
      });
}

headsum_status headsum_project_heads_sum_packed(const headsum_proj_shape* shape,
                                                const float* heads,
                                                const headsum_wo_packed* wo,
                                                const float* bias, float* y) {
  ProjDims p;
  return Entry("headsum_project_heads_sum_packed")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}, {"y", y}})
      .Check(CheckSameWeights, "packed Wo", shape, wo)
      .Run([&] {
        if (wo->dtype != DType::kF32 || wo->native) {
          return ChainedSum(p, headsum::ContiguousF32(heads, p.heads, p.seq, p.head_dim),
                            WoSource{wo->data.get(), wo->dtype, 0, true, wo->native_panels()},
                            bias, ContiguousYF32(p, y));
        }
        return ProjectHeadsSumPacked(p, heads, wo->data.get(), bias, y);
      });
}

void headsum_wo_free(headsum_wo_packed* packed) { delete packed; }

headsum_status headsum_attribution_basis_create(const headsum_proj_shape* shape,
                                                const float* wo, const float* directions,
                                                int64_t n_directions,
                                                headsum_attribution_basis** basis) {
  ProjDims p;
  uint64_t n;  // elements of the basis
  return Entry("headsum_attribution_basis_create")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"wo", wo}, {"directions", directions}, {"basis", basis}})
      .Check(CheckDirections, shape, n_directions)
      .Check([&](const char* fn) {
        return CheckElements(fn, "basis [H][R][L]", &n, shape->heads, shape->head_dim,
                             n_directions);
      })
      .RunReporting([&](const char* fn) {
        return HandOut(
            fn, "the basis",
            new (std::nothrow) headsum_attribution_basis{
                {shape->heads, shape->head_dim, shape->model_dim}, n_directions,
                AllocateFloats(static_cast<size_t>(n))},
            [&](float* wd) {
              return ProjectWeightsOntoDirections(p, wo, directions,
                                                  static_cast<size_t>(n_directions), wd);
            },
            basis);
      });
}

headsum_status headsum_head_attribution_basis(const headsum_proj_shape* shape,
                                              const float* heads,
                                              const headsum_attribution_basis* basis,
                                              float* out) {
  ProjDims p;
  return Entry("headsum_head_attribution_basis")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"basis", basis}, {"out", out}})
      .Check(CheckSameWeights, "basis", shape, basis)
      .Check([&](const char* fn) { return CheckAttributionOut(fn, shape, basis->n_directions); })
      .Run([&] {
        return AttributionFromBasis(p, heads, basis->data.get(),
                                    static_cast<size_t>(basis->n_directions), out);
      });
}

void headsum_attribution_basis_free(headsum_attribution_basis* basis) { delete basis; }

headsum_status headsum_head_contribution_norms(const headsum_proj_shape* shape,
                                               const float* heads, const float* wo,
                                               float* out) {
  ProjDims p;
  return Entry("headsum_head_contribution_norms")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}, {"out", out}})
      .Run([&] { return HeadContributionNorms(p, heads, wo, out); });
}

// ---------------------------------------------------------------------------
// oneDNN reference paths: each takes, and checks, the arguments of the kernel
// it stands beside.

headsum_status headsum_concat_project_onednn(const headsum_proj_shape* shape,
                                             const float* heads, const float* wo,
                                             const float* bias, float* y) {
  ProjDims p;
  return Entry("headsum_concat_project_onednn")
      .Check(CheckProjShape, shape, &p)
      .Pointers({{"heads", heads}, {"wo", wo}, {"y", y}})
      .HEADSUM_ONEDNN(ConcatProject(p, heads, wo, bias, y, NumThreads()));
}

headsum_status headsum_qk_scores_onednn(const headsum_attn_shape* shape, const float* q,
                                        const float* k, float* scores) {
  AttnDims a;
  return Entry("headsum_qk_scores_onednn")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"q", q}, {"k", k}, {"scores", scores}})
      .HEADSUM_ONEDNN(QkScores(a, q, k, scores, NumThreads()));
}

headsum_status headsum_softmax_v_onednn(const headsum_attn_shape* shape, const float* scores,
                                        const float* v, float* out) {
  AttnDims a;
  return Entry("headsum_softmax_v_onednn")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"scores", scores}, {"v", v}, {"out", out}})
      .HEADSUM_ONEDNN(SoftmaxV(a, scores, v, out, NumThreads()));
}

headsum_status headsum_attention_onednn(const headsum_attn_shape* shape, const float* q,
                                        const float* k, const float* v, float* out) {
  AttnDims a;
  return Entry("headsum_attention_onednn")
      .Check(CheckAttnShape, shape, &a)
      .Pointers({{"q", q}, {"k", k}, {"v", v}, {"out", out}})
      .HEADSUM_ONEDNN(Attention(a, q, k, v, out, NumThreads()));
}

}  // extern "C"

// ---------------------------------------------------------------------------
// The tensor API: strided views of f32, f16 or bf16.

namespace {

constexpr bool kAllStrides[3] = {true, true, true};
// Wo uses only its row stride; Y its b and s strides.
constexpr bool kRowStrideOnly[3] = {false, false, true};
constexpr bool kNoHeadStride[3] = {true, false, true};

ByteRange BiasRange(const float* bias, size_t model_dim) {
  ByteRange r;
  r.lo = reinterpret_cast<uintptr_t>(bias);
  r.hi = r.lo + model_dim * sizeof(float) - 1;
  return r;
}

// Wo [H*L][D] as a view, checked; only its row stride is used.
headsum_status CheckWoView(const char* fn, const headsum_proj_shape* shape,
                           const headsum_tensor* wo, TensorView* view, ByteRange* range) {
  const int64_t wo_dims[4] = {1, 1, shape->heads * shape->head_dim, shape->model_dim};
  return CheckTensor(fn, "wo", wo, wo_dims, kRowStrideOnly, false, view, range);
}

// The projection's operands on views, checked: heads, y and (unless packed)
// wo, each against its extents, y against every input.
headsum_status CheckProjectionViews(const char* fn, const headsum_proj_shape* shape,
                                    const headsum_tensor* heads, const headsum_tensor* wo,
                                    const float* bias, const headsum_tensor* y,
                                    TensorView* o_view, TensorView* wo_view,
                                    TensorView* y_view) {
  const int64_t o_dims[4] = {shape->batch, shape->heads, shape->seq, shape->head_dim};
  const int64_t y_dims[4] = {shape->batch, 1, shape->seq, shape->model_dim};
  ByteRange o_range, wo_range, y_range;
  HEADSUM_CHECK(CheckTensor(fn, "heads", heads, o_dims, kAllStrides, false, o_view, &o_range));
  if (wo != nullptr) HEADSUM_CHECK(CheckWoView(fn, shape, wo, wo_view, &wo_range));
  HEADSUM_CHECK(CheckTensor(fn, "y", y, y_dims, kNoHeadStride, true, y_view, &y_range));
  y_view->sh = 0;
  HEADSUM_CHECK(CheckDisjoint(fn, "y", y_range, "heads", o_range));
  if (wo != nullptr) HEADSUM_CHECK(CheckDisjoint(fn, "y", y_range, "wo", wo_range));
  if (bias != nullptr) {
    HEADSUM_CHECK(CheckDisjoint(fn, "y", y_range, "bias",
                                BiasRange(bias, static_cast<size_t>(shape->model_dim))));
  }
  return HEADSUM_OK;
}

// A Wo view read row by row, as it is.
WoSource Unpacked(const TensorView& wo) { return WoSource{wo.data, wo.dtype, wo.ss, false}; }

// headsum_convert's extents, each >= 1 and together addressable.
headsum_status CheckConvertDims(const char* fn, const int64_t dims[4]) {
  for (int i = 0; i < 4; ++i) {
    if (dims[i] < 1) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "dims[%d] = %lld must be >= 1", i,
                  static_cast<long long>(dims[i]));
    }
  }
  uint64_t n;
  return CheckElements(fn, "dims", &n, dims[0], dims[1], dims[2], dims[3]);
}

// headsum_convert's views, checked: dst an output that does not meet src.
headsum_status CheckConvertViews(const char* fn, const int64_t dims[4], const headsum_tensor* src,
                                 const headsum_tensor* dst, TensorView* src_view,
                                 TensorView* dst_view) {
  ByteRange src_range, dst_range;
  HEADSUM_CHECK(CheckTensor(fn, "src", src, dims, kAllStrides, false, src_view, &src_range));
  HEADSUM_CHECK(CheckTensor(fn, "dst", dst, dims, kAllStrides, true, dst_view, &dst_range));
  return CheckDisjoint(fn, "dst", dst_range, "src", src_range);
}

}  // namespace

extern "C" {

headsum_status headsum_attention_tensors(const headsum_attn_shape* shape,
                                         const headsum_tensor* q, const headsum_tensor* k,
                                         const headsum_tensor* v, const headsum_tensor* out) {
  AttnDims a;
  headsum::AttnViews views;
  return Entry("headsum_attention_tensors")
      .Check(CheckAttnShape, shape, &a)
      .Check(CheckAttnViews, shape, a, q, k, v, out, &views, nullptr)
      .Run([&] { return Attention(a, views); });
}

headsum_status headsum_attention_tensors_ex(const headsum_attn_shape* shape,
                                            const headsum_attn_options* options,
                                            const headsum_tensor* q, const headsum_tensor* k,
                                            const headsum_tensor* v, const headsum_tensor* out) {
  AttnDims a;
  headsum::AttnViews views;
  headsum::AttnOptions opt;
  ByteRange out_range;
  return Entry("headsum_attention_tensors_ex")
      .Check(CheckAttnShape, shape, &a)
      .Check(CheckAttnViews, shape, a, q, k, v, out, &views, &out_range)
      .Check([&](const char* fn) {
        return CheckAttnOptions(fn, options, shape->batch, shape->heads, shape->seq_q,
                                shape->seq_kv, &out_range, nullptr, &a, &opt);
      })
      .Run([&] { return Attention(a, views); });
}

headsum_status headsum_project_heads_sum_tensors(const headsum_proj_shape* shape,
                                                 const headsum_tensor* heads,
                                                 const headsum_tensor* wo, const float* bias,
                                                 const headsum_tensor* y) {
  ProjDims p;
  TensorView o_view, wo_view, y_view;
  return Entry("headsum_project_heads_sum_tensors")
      .Check(CheckProjShape, shape, &p)
      .Pointer("wo", wo)
      .Check(CheckProjectionViews, shape, heads, wo, bias, y, &o_view, &wo_view, &y_view)
      .Run([&] { return ChainedSum(p, o_view, Unpacked(wo_view), bias, y_view); });
}

headsum_status headsum_wo_pack_tensor(const headsum_proj_shape* shape,
                                      const headsum_tensor* wo, headsum_wo_packed** packed) {
  ProjDims p;
  TensorView wo_view;
  ByteRange wo_range;
  return Entry("headsum_wo_pack_tensor")
      .Check(CheckProjShape, shape, &p)
      .Pointer("packed", packed)
      .Check(CheckWoView, shape, wo, &wo_view, &wo_range)
      .RunReporting([&](const char* fn) {
        return HandOutPackedWo(
            fn, shape, p, wo_view,
            [&](float* panels) { return PackWo(p, Unpacked(wo_view), panels); }, packed);
      });
}

headsum_status headsum_project_heads_sum_packed_tensors(const headsum_proj_shape* shape,
                                                        const headsum_tensor* heads,
                                                        const headsum_wo_packed* wo,
                                                        const float* bias,
                                                        const headsum_tensor* y) {
  ProjDims p;
  TensorView o_view, y_view;
  // The packed panels are the library's own memory: y cannot be in them
  // unless the caller wrote into a freed handle.
  return Entry("headsum_project_heads_sum_packed_tensors")
      .Check(CheckProjShape, shape, &p)
      .Pointer("wo", wo)
      .Check(CheckSameWeights, "packed Wo", shape, wo)
      .Check(CheckProjectionViews, shape, heads, nullptr, bias, y, &o_view, nullptr, &y_view)
      .Run([&] {
        return ChainedSum(p, o_view,
                          WoSource{wo->data.get(), wo->dtype, 0, true, wo->native_panels()},
                          bias, y_view);
      });
}

headsum_status headsum_convert(const int64_t dims[4], const headsum_tensor* src,
                               const headsum_tensor* dst) {
  TensorView src_view, dst_view;
  return Entry("headsum_convert")
      .Pointer("dims", dims)
      .Check(CheckConvertDims, dims)
      .Check(CheckConvertViews, dims, src, dst, &src_view, &dst_view)
      .Run([&] {
        const size_t d[4] = {static_cast<size_t>(dims[0]), static_cast<size_t>(dims[1]),
                             static_cast<size_t>(dims[2]), static_cast<size_t>(dims[3])};
        return Convert(d, src_view, dst_view);
      });
}

}  // extern "C"
