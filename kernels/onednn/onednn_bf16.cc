// oneDNN bf16 twins of the native paths (for the benchmarks): a composed
// attention and a concat-then-GEMM projection on bf16 operands, each matmul
// bf16 x bf16 with f32 accumulation (on AMX or AVX512_BF16 where the CPU has
// them: see the implementation names).
//
//   AttentionBf16      S = scale Q K^T (+ full-size causal mask) in f32,
//                      P = softmax(S) written as bf16 (softmax_v2, f32 in,
//                      bf16 out), O = P V in bf16
//   ConcatProjectBf16  concat O [B][H][S][L] -> [B*S][H*L] (bf16 copy), one
//                      matmul with Wo (bf16) + bias into f32 y
//
// GQA needs no copy: Q [B][H][Sq][L] read as [B*Hkv][G*Sq][L].  Primitives
// are cached by shape and thread count; scratch (S, P, the concatenated O)
// is per thread and only grows.
#include <algorithm>
#include <array>
#include <cstring>
#include <dnnl.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/onednn/onednn_ref.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace headsum {
namespace onednn {
namespace {

using dnnl::memory;
using Dims = memory::dims;
using Tag = memory::format_tag;
constexpr memory::data_type kF32 = memory::data_type::f32;
constexpr memory::data_type kBf16 = memory::data_type::bf16;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

class Threads {
 public:
  explicit Threads(int n) {
#if defined(_OPENMP)
    saved_ = omp_get_max_threads();
    if (n > 0 && n != saved_) omp_set_num_threads(n);
    current_ = omp_get_max_threads();
#else
    (void)n;
#endif
  }
  ~Threads() {
#if defined(_OPENMP)
    omp_set_num_threads(saved_);
#endif
  }
  int current() const { return current_; }

 private:
  int saved_ = 1, current_ = 1;
};

struct Prims {
  dnnl::matmul qk, pv;
  dnnl::softmax_v2_forward softmax;
  std::vector<float> mask;  // [B*Hkv][G*Sq][Skv] 0 / -inf, empty when none
  std::string impls;
};

struct ProjPrim {
  dnnl::matmul mm;
  std::string impl;
};

std::mutex g_mutex;
std::map<std::array<int64_t, 8>, std::shared_ptr<Prims>> g_attn;
std::map<std::array<int64_t, 8>, std::shared_ptr<ProjPrim>> g_proj;

memory Wrap(const memory::desc& md, const void* p) {
  return memory(md, Engine(), const_cast<void*>(p));
}

std::shared_ptr<Prims> AttnPrims(const AttnDims& a, int threads) {
  const int64_t B = int64_t(a.batch * a.kv_heads), R = int64_t(a.group() * a.seq_q);
  const int64_t J = int64_t(a.seq_kv), L = int64_t(a.head_dim);
  const bool masked = a.causal && a.visible_keys(0) < a.seq_kv;
  int32_t scale_bits;
  std::memcpy(&scale_bits, &a.scale, 4);
  const std::array<int64_t, 8> key{B, R, J, L, masked, scale_bits, threads, int64_t(a.seq_q)};
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_attn.find(key);
  if (it != g_attn.end()) return it->second;
  auto p = std::make_shared<Prims>();
  const memory::desc q({B, R, L}, kBf16, Tag::abc);
  const memory::desc kt({B, L, J}, kBf16, Dims{J * L, 1, L});
  const memory::desc s({B, R, J}, kF32, Tag::abc);
  dnnl::primitive_attr qk_attr;
  qk_attr.set_output_scales(0, {a.scale});
  if (masked) {
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add, s);
    qk_attr.set_post_ops(ops);
    p->mask.resize(size_t(B * R * J));
    for (int64_t r = 0; r < B * R; ++r) {
      const size_t visible = a.visible_keys(size_t(r) % a.seq_q);
      float* row = p->mask.data() + r * J;
      std::fill(row, row + visible, 0.0f);
      std::fill(row + visible, row + J, -std::numeric_limits<float>::infinity());
    }
  }
  const dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(q, kt, s), qk_attr, Engine());
  const memory::desc s2({B * R, J}, kF32, Tag::ab), p2({B * R, J}, kBf16, Tag::ab);
  const dnnl::softmax_v2_forward::primitive_desc sm_pd(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                     dnnl::algorithm::softmax_accurate, s2, p2, 1),
      Engine());
  const memory::desc pm({B, R, J}, kBf16, Tag::abc), v({B, J, L}, kBf16, Tag::abc),
      o({B, R, L}, kBf16, Tag::abc);
  const dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(pm, v, o), Engine());
  p->qk = dnnl::matmul(qk_pd);
  p->softmax = dnnl::softmax_v2_forward(sm_pd);
  p->pv = dnnl::matmul(pv_pd);
  p->impls = std::string("qk_matmul=") + qk_pd.impl_info_str() +
             " softmax=" + sm_pd.impl_info_str() + " pv_matmul=" + pv_pd.impl_info_str();
  g_attn.emplace(key, p);
  return p;
}

std::shared_ptr<ProjPrim> ProjectPrim(const ProjDims& p, bool has_bias, int threads) {
  const int64_t M = int64_t(p.batch * p.seq), K = int64_t(p.inner()), D = int64_t(p.model_dim);
  const std::array<int64_t, 8> key{M, K, D, has_bias, threads, 0, 0, 0};
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_proj.find(key);
  if (it != g_proj.end()) return it->second;
  const memory::desc src({M, K}, kBf16, Tag::ab), wei({K, D}, kBf16, Tag::ab),
      dst({M, D}, kF32, Tag::ab), bias({1, D}, kF32, Tag::ab);
  const dnnl::matmul::primitive_desc pd =
      has_bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias, dst), Engine())
               : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), Engine());
  auto made = std::make_shared<ProjPrim>();
  made->mm = dnnl::matmul(pd);
  made->impl = std::string("project_matmul=") + pd.impl_info_str();
  g_proj.emplace(key, made);
  return made;
}

template <class T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

headsum_status AttentionBf16(const AttnDims& a, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, uint16_t* out, int num_threads,
                             std::string* impls) {
  try {
    Threads threads(num_threads);
    const std::shared_ptr<Prims> p = AttnPrims(a, threads.current());
    if (impls) *impls = p->impls;
    const int64_t B = int64_t(a.batch * a.kv_heads), R = int64_t(a.group() * a.seq_q);
    const int64_t J = int64_t(a.seq_kv), L = int64_t(a.head_dim);
    thread_local std::vector<float> s_buf;
    thread_local std::vector<uint16_t> p_buf;
    float* s = Grow(s_buf, size_t(B * R * J));
    uint16_t* pr = Grow(p_buf, size_t(B * R * J));
    dnnl::stream stream(Engine());
    const memory::desc s_md({B, R, J}, kF32, Tag::abc);
    std::unordered_map<int, memory> qk_args{
        {DNNL_ARG_SRC, Wrap(memory::desc({B, R, L}, kBf16, Tag::abc), q)},
        {DNNL_ARG_WEIGHTS, Wrap(memory::desc({B, L, J}, kBf16, Dims{J * L, 1, L}), k)},
        {DNNL_ARG_DST, Wrap(s_md, s)}};
    if (!p->mask.empty()) {
      qk_args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, Wrap(s_md, p->mask.data()));
    }
    p->qk.execute(stream, qk_args);
    p->softmax.execute(stream, {{DNNL_ARG_SRC, Wrap(memory::desc({B * R, J}, kF32, Tag::ab), s)},
                                {DNNL_ARG_DST, Wrap(memory::desc({B * R, J}, kBf16, Tag::ab), pr)}});
    p->pv.execute(stream, {{DNNL_ARG_SRC, Wrap(memory::desc({B, R, J}, kBf16, Tag::abc), pr)},
                           {DNNL_ARG_WEIGHTS, Wrap(memory::desc({B, J, L}, kBf16, Tag::abc), v)},
                           {DNNL_ARG_DST, Wrap(memory::desc({B, R, L}, kBf16, Tag::abc), out)}});
    stream.wait();
    return HEADSUM_OK;
  } catch (const dnnl::error&) {
    return HEADSUM_ERR_UNSUPPORTED;
  } catch (const std::bad_alloc&) {
    return HEADSUM_ERR_OUT_OF_MEMORY;
  }
}

headsum_status ConcatProjectBf16(const ProjDims& p, const uint16_t* heads, const uint16_t* wo,
                                 const float* bias, float* y, int num_threads,
                                 std::string* impls) {
  try {
    Threads threads(num_threads);
    const std::shared_ptr<ProjPrim> prim = ProjectPrim(p, bias != nullptr, threads.current());
    if (impls) *impls = prim->impl;
    const size_t S = p.seq, H = p.heads, L = p.head_dim, K = p.inner();
    thread_local std::vector<uint16_t> concat_buf;
    uint16_t* concat = Grow(concat_buf, p.batch * S * K);
    const long long rows = static_cast<long long>(p.batch * S);
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < rows; ++r) {
      const size_t b = size_t(r) / S, s = size_t(r) % S;
      for (size_t h = 0; h < H; ++h) {
        std::memcpy(concat + size_t(r) * K + h * L, heads + ((b * H + h) * S + s) * L, L * 2);
      }
    }
    const int64_t M = rows, Kd = int64_t(K), D = int64_t(p.model_dim);
    dnnl::stream stream(Engine());
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, Wrap(memory::desc({M, Kd}, kBf16, Tag::ab), concat)},
        {DNNL_ARG_WEIGHTS, Wrap(memory::desc({Kd, D}, kBf16, Tag::ab), wo)},
        {DNNL_ARG_DST, Wrap(memory::desc({M, D}, kF32, Tag::ab), y)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, Wrap(memory::desc({1, D}, kF32, Tag::ab), bias));
    prim->mm.execute(stream, args);
    stream.wait();
    return HEADSUM_OK;
  } catch (const dnnl::error&) {
    return HEADSUM_ERR_UNSUPPORTED;
  } catch (const std::bad_alloc&) {
    return HEADSUM_ERR_OUT_OF_MEMORY;
  }
}

}  // namespace onednn
}  // namespace headsum
