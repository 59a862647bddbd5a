// headsum's C++ face: shapes with named fields, views that carry their
// element count (checked against the shape), exceptions instead of status
// codes.  The same kernels as the C API underneath.
//
//   headsum::AttnShape shape{.batch = 1, .heads = 8, .seq_q = 20, .seq_kv = 20,
//                            .head_dim = 64};
//   headsum::attention(shape, q, k, v, o);            // vectors or spans
//   headsum::ProjShape proj{.batch = 1, .seq = 20, .heads = 8, .head_dim = 64,
//                           .model_dim = 512};
//   headsum::project_heads_sum(proj, o, wo, bias, y);
#ifndef HEADSUM_HEADSUM_HPP_
#define HEADSUM_HEADSUM_HPP_

#include <stddef.h>
#include <stdint.h>

#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "headsum/headsum.h"

namespace headsum {

// Thrown for every status other than HEADSUM_OK; what() is headsum's message.
class Error : public std::runtime_error {
 public:
  Error(headsum_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  headsum_status status() const { return status_; }

 private:
  headsum_status status_;
};

inline void check(headsum_status status) {
  if (status != HEADSUM_OK) throw Error(status, headsum_last_error());
}

// A contiguous run of T: a pointer and how many elements lie behind it.
template <class T>
class View {
 public:
  View() = default;
  View(T* data, size_t size) : data_(data), size_(size) {}
  template <class Vec, class = decltype(static_cast<T*>(std::declval<Vec&>().data()))>
  View(Vec& v) : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit on purpose
  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};
using In = View<const float>;
using Out = View<float>;

namespace detail {
inline size_t count(int64_t a, int64_t b, int64_t c = 1, int64_t d = 1) {
  if (a < 1 || b < 1 || c < 1 || d < 1) return 0;  // the C call names the bad dim
  return static_cast<size_t>(a) * static_cast<size_t>(b) * static_cast<size_t>(c) *
         static_cast<size_t>(d);
}
template <class T>
void expect(const char* fn, const char* name, const View<T>& view, size_t elements) {
  if (view.data() != nullptr && elements != 0 && view.size() < elements) {
    throw Error(HEADSUM_ERR_INVALID_ARGUMENT,
                std::string(fn) + ": " + name + " holds " + std::to_string(view.size()) +
                    " floats, the shape needs " + std::to_string(elements));
  }
}
}  // namespace detail

struct AttnShape {
  int64_t batch = 1, heads = 1, kv_heads = 0;  // kv_heads 0: = heads
  int64_t seq_q = 1, seq_kv = 1, head_dim = 1;
  float scale = 0.0f;                          // 0: 1/sqrt(head_dim)
  bool causal = false;

  headsum_attn_shape c() const {
    return {batch, heads, kv_heads, seq_q, seq_kv, head_dim, scale, causal ? 1 : 0};
  }
  int64_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
  size_t q_elements() const { return detail::count(batch, heads, seq_q, head_dim); }
  size_t kv_elements() const { return detail::count(batch, kv(), seq_kv, head_dim); }
  size_t score_elements() const { return detail::count(batch, heads, seq_q, seq_kv); }
};

struct ProjShape {
  int64_t batch = 1, seq = 1, heads = 1, head_dim = 1, model_dim = 1;

  headsum_proj_shape c() const { return {batch, seq, heads, head_dim, model_dim}; }
  size_t head_elements() const { return detail::count(batch, heads, seq, head_dim); }
  size_t wo_elements() const { return detail::count(heads, head_dim, model_dim); }
  size_t y_elements() const { return detail::count(batch, seq, model_dim); }
  size_t per_head_elements() const { return detail::count(batch, seq, heads, model_dim); }
};

// S = scale Q K^T (masked: -inf).
inline void qk_scores(const AttnShape& s, In q, In k, Out scores) {
  detail::expect("qk_scores", "q", q, s.q_elements());
  detail::expect("qk_scores", "k", k, s.kv_elements());
  detail::expect("qk_scores", "scores", scores, s.score_elements());
  const headsum_attn_shape c = s.c();
  check(headsum_qk_scores(&c, q.data(), k.data(), scores.data()));
}

// O = softmax(S) V.
inline void softmax_v(const AttnShape& s, In scores, In v, Out out) {
  detail::expect("softmax_v", "scores", scores, s.score_elements());
  detail::expect("softmax_v", "v", v, s.kv_elements());
  detail::expect("softmax_v", "out", out, s.q_elements());
  const headsum_attn_shape c = s.c();
  check(headsum_softmax_v(&c, scores.data(), v.data(), out.data()));
}

// O = softmax(scale Q K^T + mask) V, fused.
inline void attention(const AttnShape& s, In q, In k, In v, Out out) {
  detail::expect("attention", "q", q, s.q_elements());
  detail::expect("attention", "k", k, s.kv_elements());
  detail::expect("attention", "v", v, s.kv_elements());
  detail::expect("attention", "out", out, s.q_elements());
  const headsum_attn_shape c = s.c();
  check(headsum_attention(&c, q.data(), k.data(), v.data(), out.data()));
}

// Y = sum_h O_h Wo[h] + bias (bias may be an empty view).
inline void project_heads_sum(const ProjShape& s, In heads, In wo, In bias, Out y) {
  detail::expect("project_heads_sum", "heads", heads, s.head_elements());
  detail::expect("project_heads_sum", "wo", wo, s.wo_elements());
  detail::expect("project_heads_sum", "bias", bias, detail::count(s.model_dim, 1));
  detail::expect("project_heads_sum", "y", y, s.y_elements());
  const headsum_proj_shape c = s.c();
  check(headsum_project_heads_sum(&c, heads.data(), wo.data(), bias.data(), y.data()));
}

// Wo packed once for many projections (RAII over headsum_wo_pack).  Movable,
// not copyable.
class PackedWo {
 public:
  PackedWo(const ProjShape& s, In wo) {
    detail::expect("PackedWo", "wo", wo, s.wo_elements());
    const headsum_proj_shape c = s.c();
    check(headsum_wo_pack(&c, wo.data(), &packed_));
  }
  ~PackedWo() { headsum_wo_free(packed_); }
  PackedWo(const PackedWo&) = delete;
  PackedWo& operator=(const PackedWo&) = delete;
  PackedWo(PackedWo&& other) noexcept : packed_(std::exchange(other.packed_, nullptr)) {}
  PackedWo& operator=(PackedWo&& other) noexcept {
    std::swap(packed_, other.packed_);
    return *this;
  }

  // project_heads_sum with this Wo; bitwise the same result.
  void project_heads_sum(const ProjShape& s, In heads, In bias, Out y) const {
    const char* fn = "PackedWo::project_heads_sum";
    detail::expect(fn, "heads", heads, s.head_elements());
    detail::expect(fn, "bias", bias, detail::count(s.model_dim, 1));
    detail::expect(fn, "y", y, s.y_elements());
    const headsum_proj_shape c = s.c();
    check(headsum_project_heads_sum_packed(&c, heads.data(), packed_, bias.data(), y.data()));
  }
  const headsum_wo_packed* get() const { return packed_; }
  // Takes ownership of a handle from headsum_wo_pack / headsum_wo_pack_tensor.
  static PackedWo adopt(headsum_wo_packed* packed) { return PackedWo(packed); }

 private:
  explicit PackedWo(headsum_wo_packed* packed) : packed_(packed) {}
  headsum_wo_packed* packed_ = nullptr;
};

// The oneDNN concat-then-GEMM reference of project_heads_sum.
inline void concat_project_onednn(const ProjShape& s, In heads, In wo, In bias, Out y) {
  detail::expect("concat_project_onednn", "heads", heads, s.head_elements());
  detail::expect("concat_project_onednn", "wo", wo, s.wo_elements());
  detail::expect("concat_project_onednn", "bias", bias, detail::count(s.model_dim, 1));
  detail::expect("concat_project_onednn", "y", y, s.y_elements());
  const headsum_proj_shape c = s.c();
  check(headsum_concat_project_onednn(&c, heads.data(), wo.data(), bias.data(), y.data()));
}

// y = sum_h gates[h] O_h Wo[h] + bias; per_head[b][s][h] = O_h Wo[h].
// Empty views mean NULL (gates: all 1; y or per_head: not wanted).
inline void project_heads_sum_ex(const ProjShape& s, In heads, In wo, In bias, In gates,
                                 Out y, Out per_head) {
  const char* fn = "project_heads_sum_ex";
  detail::expect(fn, "heads", heads, s.head_elements());
  detail::expect(fn, "wo", wo, s.wo_elements());
  detail::expect(fn, "bias", bias, detail::count(s.model_dim, 1));
  detail::expect(fn, "head_gates", gates, detail::count(s.heads, 1));
  detail::expect(fn, "y", y, s.y_elements());
  detail::expect(fn, "per_head", per_head, s.per_head_elements());
  const headsum_proj_shape c = s.c();
  check(headsum_project_heads_sum_ex(&c, heads.data(), wo.data(), bias.data(), gates.data(),
                                     y.data(), per_head.data()));
}

// out[b][s][h][r] = (O_h Wo[h]) . directions[r]; directions [R][D].
inline void head_attribution(const ProjShape& s, In heads, In wo, In directions,
                             int64_t n_directions, Out out) {
  const char* fn = "head_attribution";
  detail::expect(fn, "heads", heads, s.head_elements());
  detail::expect(fn, "wo", wo, s.wo_elements());
  detail::expect(fn, "directions", directions, detail::count(n_directions, s.model_dim));
  detail::expect(fn, "out", out, detail::count(s.batch, s.seq, s.heads, n_directions));
  const headsum_proj_shape c = s.c();
  check(headsum_head_attribution(&c, heads.data(), wo.data(), directions.data(), n_directions,
                                 out.data()));
}

// Wo[h] times each direction, computed once for weights and directions that
// stay fixed; attribute() then costs O(B S H L R) per call.
class AttributionBasis {
 public:
  AttributionBasis(const ProjShape& s, In wo, In directions, int64_t n_directions)
      : n_directions_(n_directions) {
    detail::expect("AttributionBasis", "wo", wo, s.wo_elements());
    detail::expect("AttributionBasis", "directions", directions,
                   detail::count(n_directions, s.model_dim));
    const headsum_proj_shape c = s.c();
    check(headsum_attribution_basis_create(&c, wo.data(), directions.data(), n_directions,
                                           &basis_));
  }
  ~AttributionBasis() { headsum_attribution_basis_free(basis_); }
  AttributionBasis(const AttributionBasis&) = delete;
  AttributionBasis& operator=(const AttributionBasis&) = delete;

  // out[b][s][h][r] = (O_h Wo[h]) . directions[r].
  void attribute(const ProjShape& s, In heads, Out out) const {
    detail::expect("AttributionBasis::attribute", "heads", heads, s.head_elements());
    detail::expect("AttributionBasis::attribute", "out", out,
                   detail::count(s.batch, s.seq, s.heads, n_directions_));
    const headsum_proj_shape c = s.c();
    check(headsum_head_attribution_basis(&c, heads.data(), basis_, out.data()));
  }
  int64_t n_directions() const { return n_directions_; }

 private:
  headsum_attribution_basis* basis_ = nullptr;
  int64_t n_directions_;
};

// out[b][s][h] = || O_h Wo[h] ||_2.
inline void head_contribution_norms(const ProjShape& s, In heads, In wo, Out out) {
  const char* fn = "head_contribution_norms";
  detail::expect(fn, "heads", heads, s.head_elements());
  detail::expect(fn, "wo", wo, s.wo_elements());
  detail::expect(fn, "out", out, detail::count(s.batch, s.seq, s.heads));
  const headsum_proj_shape c = s.c();
  check(headsum_head_contribution_norms(&c, heads.data(), wo.data(), out.data()));
}

// Targets and threads.
inline std::string active_target() { return headsum_active_target(); }
inline std::vector<std::string> compiled_targets() {
  const int n = headsum_compiled_targets(nullptr, 0);
  std::vector<const char*> names(static_cast<size_t>(n));
  headsum_compiled_targets(names.data(), n);
  return std::vector<std::string>(names.begin(), names.end());
}
inline void set_target(const std::string& name) { check(headsum_set_target(name.c_str())); }
inline void reset_target() { check(headsum_set_target(nullptr)); }
inline void set_num_threads(int n) { check(headsum_set_num_threads(n)); }
// headsum_fpmath: Fpmath::bf16 lets f32/f16 inputs take a native bf16 path.
enum class Fpmath : int { strict = HEADSUM_FPMATH_STRICT, bf16 = HEADSUM_FPMATH_BF16 };
inline void set_fpmath(Fpmath mode) { check(headsum_set_fpmath(static_cast<int>(mode))); }
inline Fpmath fpmath() { return static_cast<Fpmath>(headsum_get_fpmath()); }

// Runs the kernels on `name` for the lifetime of this object.
class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) : previous_(active_target()) {
    set_target(name);
  }
  ~ScopedTarget() { headsum_set_target(previous_.c_str()); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;

 private:
  std::string previous_;
};

// ---------------------------------------------------------------------------
// Tensors: 16-bit element types and strided views (the C tensor API).
//
//   std::vector<headsum::bf16> k_cache(B * Hkv * cap * L);
//   auto k = headsum::Tensor<const headsum::bf16>::bhsd(k_cache.data(), B, Hkv, len, L);
//   k.strides[1] = cap * L;                  // a cache with room for cap tokens
//   headsum::attention(shape, q, k, v, o);   // any mix of float, f16, bf16

// 16-bit floats as stored: bf16 (8-bit exponent, 7-bit mantissa) and IEEE
// f16.  Construction from float rounds to nearest even (NaN stays NaN, f16
// overflow gives inf); conversion to float is exact.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t FromFloat(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u | 0x00400000u) >> 16);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
};
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t e = (bits >> 10) & 0x1Fu, m = bits & 0x3FFu;
    uint32_t u;
    if (e == 0x1F) {
      u = sign | 0x7F800000u | (m << 13);
    } else if (e != 0) {
      u = sign | ((e + 112) << 23) | (m << 13);
    } else {  // zero, subnormal: m * 2^-24
      float f = static_cast<float>(m) * 5.9604644775390625e-08f;
      __builtin_memcpy(&u, &f, 4);
      u |= sign;
    }
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t FromFloat(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
    if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65536: inf
    if (a < 0x38800000u) {  // f16 subnormal or zero: round at 2^-24
      float x, half = 0.5f;
      __builtin_memcpy(&x, &a, 4);
      x += half;
      uint32_t r;
      __builtin_memcpy(&r, &x, 4);
      return static_cast<uint16_t>(sign | (r - 0x3F000000u));
    }
    const uint32_t odd = (a >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((a + 0xC8000FFFu + odd) >> 13));
  }
};

namespace detail {
template <class T> struct DtypeOf;
template <> struct DtypeOf<float> { static constexpr headsum_dtype value = HEADSUM_F32; };
template <> struct DtypeOf<bf16> { static constexpr headsum_dtype value = HEADSUM_BF16; };
template <> struct DtypeOf<f16> { static constexpr headsum_dtype value = HEADSUM_F16; };
template <class T> struct DtypeOf<const T> : DtypeOf<T> {};
}  // namespace detail

// A strided [b][h][s][l] view of T (float, f16 or bf16; const for inputs):
// element (b, h, s, l) at data + b*strides[0] + h*strides[1] + s*strides[2]
// + l.  Carries its extents, which the calls check against their shape.
template <class T>
struct Tensor {
  T* data = nullptr;
  int64_t extents[4] = {1, 1, 1, 1};
  int64_t strides[3] = {0, 0, 0};

  static constexpr headsum_dtype dtype = detail::DtypeOf<T>::value;

  // Contiguous [B][H][S][L].
  static Tensor bhsd(T* data, int64_t b, int64_t h, int64_t s, int64_t l) {
    return Tensor{data, {b, h, s, l}, {h * s * l, s * l, l}};
  }
  // Token-major [B][S][H][L] (an engine's usual layout), indexed [b][h][s][l].
  static Tensor bshd(T* data, int64_t b, int64_t h, int64_t s, int64_t l) {
    return Tensor{data, {b, h, s, l}, {s * h * l, l, h * l}};
  }
  // Rows of a matrix [rows][cols] with row stride ld (>= cols): Wo, Y.
  static Tensor matrix(T* data, int64_t rows, int64_t cols, int64_t ld) {
    return Tensor{data, {1, 1, rows, cols}, {0, 0, ld}};
  }
  // The same memory as a view of const T.
  operator Tensor<const T>() const {  // NOLINT: implicit on purpose
    return Tensor<const T>{data, {extents[0], extents[1], extents[2], extents[3]},
                           {strides[0], strides[1], strides[2]}};
  }
  headsum_tensor c() const {
    headsum_tensor t;
    t.data = const_cast<void*>(static_cast<const void*>(data));
    t.dtype = dtype;
    t.strides[0] = strides[0];
    t.strides[1] = strides[1];
    t.strides[2] = strides[2];
    return t;
  }
};

namespace detail {
template <class T>
void expect_extents(const char* fn, const char* name, const Tensor<T>& t, int64_t e0,
                    int64_t e1, int64_t e2, int64_t e3) {
  if (t.extents[0] == e0 && t.extents[1] == e1 && t.extents[2] == e2 && t.extents[3] == e3) {
    return;
  }
  throw Error(HEADSUM_ERR_INVALID_ARGUMENT,
              std::string(fn) + ": " + name + " is [" + std::to_string(t.extents[0]) + "][" +
                  std::to_string(t.extents[1]) + "][" + std::to_string(t.extents[2]) + "][" +
                  std::to_string(t.extents[3]) + "], the shape needs [" + std::to_string(e0) +
                  "][" + std::to_string(e1) + "][" + std::to_string(e2) + "][" +
                  std::to_string(e3) + "]");
}
}  // namespace detail

// attention on views: q [B][H][Sq][L], k and v [B][Hkv][Skv][L] (a cache of
// any capacity: only the first Skv positions are read), out [B][H][Sq][L].
template <class TQ, class TK, class TV, class TO>
void attention(const AttnShape& s, const Tensor<TQ>& q, const Tensor<TK>& k,
               const Tensor<TV>& v, const Tensor<TO>& out) {
  const char* fn = "attention";
  detail::expect_extents(fn, "q", q, s.batch, s.heads, s.seq_q, s.head_dim);
  detail::expect_extents(fn, "k", k, s.batch, s.kv(), s.seq_kv, s.head_dim);
  detail::expect_extents(fn, "v", v, s.batch, s.kv(), s.seq_kv, s.head_dim);
  detail::expect_extents(fn, "out", out, s.batch, s.heads, s.seq_q, s.head_dim);
  const headsum_attn_shape c = s.c();
  const headsum_tensor tq = q.c(), tk = k.c(), tv = v.c(), to = out.c();
  check(headsum_attention_tensors(&c, &tq, &tk, &tv, &to));
}

// ---- What a model adds to the scores (headsum_attn_options) ----
//
//   headsum::AttnOptions opt;
//   opt.window = 4096;                         // a sliding layer
//   opt.softcap = 50.0f;                       // Gemma 2
//   opt.sinks = sinks;                         // [H] (gpt-oss)
//   opt.bias = headsum::AttnBias::of(mask);    // [B][1][1][Skv]: broadcast
//   headsum::attention(shape, opt, q, k, v, o);

// An additive bias on the scores, indexed [b][h][i][j] (any element type):
// a Tensor whose extents are the call's [B][H][Sq][Skv], or 1 on an index
// it broadcasts over (b, h, i; its stride there is then taken as 0), j
// contiguous.  -inf removes a key.  Empty (of() never called): none.
struct AttnBias {
  headsum_tensor view{};
  int64_t extents[4] = {0, 0, 0, 0};

  template <class T>
  static AttnBias of(const Tensor<T>& t) {
    AttnBias b;
    b.view = t.c();
    for (int i = 0; i < 4; ++i) b.extents[i] = t.extents[i];
    return b;
  }
  bool present() const { return view.data != nullptr; }
};

// headsum_attn_options with views: window (0: none), softcap (0: none),
// ALiBi slopes and sinks [H] (empty: none), the bias (empty: none).
struct AttnOptions {
  int64_t window = 0;
  float softcap = 0.0f;
  In alibi_slopes;
  In sinks;
  AttnBias bias;
};

namespace detail {
// `o` as the C options for a call over [B][H][Sq][Skv]: the views' sizes
// checked (slopes and sinks hold H, the bias's extents are the call's or 1),
// the bias's strides 0 where it broadcasts (into *bias).
inline headsum_attn_options c_options(const char* fn, const AttnOptions& o, int64_t batch,
                                      int64_t heads, int64_t seq_q, int64_t seq_kv,
                                      headsum_tensor* bias) {
  expect(fn, "alibi_slopes", o.alibi_slopes, count(heads, 1));
  expect(fn, "sinks", o.sinks, count(heads, 1));
  headsum_attn_options c;
  c.window = o.window;
  c.softcap = o.softcap;
  c.alibi_slopes = o.alibi_slopes.size() != 0 ? o.alibi_slopes.data() : nullptr;
  c.sinks = o.sinks.size() != 0 ? o.sinks.data() : nullptr;
  c.bias = nullptr;
  if (o.bias.present()) {
    const int64_t want[4] = {batch, heads, seq_q, seq_kv};
    *bias = o.bias.view;
    for (int i = 0; i < 4; ++i) {
      const int64_t e = o.bias.extents[i];
      if (e == want[i]) continue;
      if (e == 1 && i < 3) {
        bias->strides[i] = 0;  // broadcast
        continue;
      }
      throw Error(HEADSUM_ERR_INVALID_ARGUMENT,
                  std::string(fn) + ": bias extent " + std::to_string(i) + " is " +
                      std::to_string(e) + ", the call needs " + std::to_string(want[i]) +
                      (i < 3 ? " (or 1 to broadcast)" : " (j is not broadcast)"));
    }
    c.bias = bias;
  }
  return c;
}
}  // namespace detail

// attention on views with options (headsum_attention_tensors_ex).
template <class TQ, class TK, class TV, class TO>
void attention(const AttnShape& s, const AttnOptions& options, const Tensor<TQ>& q,
               const Tensor<TK>& k, const Tensor<TV>& v, const Tensor<TO>& out) {
  const char* fn = "attention";
  detail::expect_extents(fn, "q", q, s.batch, s.heads, s.seq_q, s.head_dim);
  detail::expect_extents(fn, "k", k, s.batch, s.kv(), s.seq_kv, s.head_dim);
  detail::expect_extents(fn, "v", v, s.batch, s.kv(), s.seq_kv, s.head_dim);
  detail::expect_extents(fn, "out", out, s.batch, s.heads, s.seq_q, s.head_dim);
  headsum_tensor bias;
  const headsum_attn_options opt =
      detail::c_options(fn, options, s.batch, s.heads, s.seq_q, s.seq_kv, &bias);
  const headsum_attn_shape c = s.c();
  const headsum_tensor tq = q.c(), tk = k.c(), tv = v.c(), to = out.c();
  check(headsum_attention_tensors_ex(&c, &opt, &tq, &tk, &tv, &to));
}

// project_heads_sum on views: heads [B][H][S][L], wo a [H*L][D] matrix,
// y [B][1][S][D] (Tensor::bhsd(y, B, 1, S, D) or with a row stride); bias
// [D] or an empty view.
template <class TO, class TW, class TY>
void project_heads_sum(const ProjShape& s, const Tensor<TO>& heads, const Tensor<TW>& wo,
                       In bias, const Tensor<TY>& y) {
  const char* fn = "project_heads_sum";
  detail::expect_extents(fn, "heads", heads, s.batch, s.heads, s.seq, s.head_dim);
  detail::expect_extents(fn, "wo", wo, 1, 1, s.heads * s.head_dim, s.model_dim);
  detail::expect_extents(fn, "y", y, s.batch, 1, s.seq, s.model_dim);
  detail::expect(fn, "bias", bias, detail::count(s.model_dim, 1));
  const headsum_proj_shape c = s.c();
  const headsum_tensor th = heads.c(), tw = wo.c(), ty = y.c();
  check(headsum_project_heads_sum_tensors(&c, &th, &tw, bias.data(), &ty));
}

// Wo packed once in its own dtype (16-bit packs stay 16-bit).
template <class TW>
PackedWo pack_wo(const ProjShape& s, const Tensor<TW>& wo) {
  detail::expect_extents("pack_wo", "wo", wo, 1, 1, s.heads * s.head_dim, s.model_dim);
  const headsum_proj_shape c = s.c();
  const headsum_tensor tw = wo.c();
  headsum_wo_packed* packed = nullptr;
  check(headsum_wo_pack_tensor(&c, &tw, &packed));
  return PackedWo::adopt(packed);
}

// project_heads_sum from a packed Wo, on views.
template <class TO, class TY>
void project_heads_sum(const ProjShape& s, const Tensor<TO>& heads, const PackedWo& wo,
                       In bias, const Tensor<TY>& y) {
  const char* fn = "project_heads_sum";
  detail::expect_extents(fn, "heads", heads, s.batch, s.heads, s.seq, s.head_dim);
  detail::expect_extents(fn, "y", y, s.batch, 1, s.seq, s.model_dim);
  detail::expect(fn, "bias", bias, detail::count(s.model_dim, 1));
  const headsum_proj_shape c = s.c();
  const headsum_tensor th = heads.c(), ty = y.c();
  check(headsum_project_heads_sum_packed_tensors(&c, &th, wo.get(), bias.data(), &ty));
}

// dst = src over src's extents (which dst must share), rounded to dst's type:
// how new tokens go into a 16-bit KV cache.
template <class TS, class TD>
void convert(const Tensor<TS>& src, const Tensor<TD>& dst) {
  detail::expect_extents("convert", "dst", dst, src.extents[0], src.extents[1], src.extents[2],
                         src.extents[3]);
  const headsum_tensor ts = src.c(), td = dst.c();
  check(headsum_convert(src.extents, &ts, &td));
}

// ---- The whole layer and its KV cache (headsum_mha_*, headsum_kv_cache_*) ----
//
//   headsum::MhaConfig config{.model_dim = 512, .heads = 8, .head_dim = 64,
//                             .rope_theta = 10000};
//   headsum::Mha mha(config, {.wq = wq, .wk = wk, .wv = wv, .wo = wo});
//   headsum::KvCache cache = mha.new_cache(/*batch=*/1, /*capacity=*/4096);
//   mha.forward(cache, /*batch=*/1, /*seq=*/prompt_len, x, y);   // prefill
//   mha.forward(cache, 1, 1, x_next, y_next);                    // a step
//
// With what the model adds to the scores (copied; no bias):
//   headsum::AttnOptions opt;
//   opt.window = 4096;
//   opt.sinks = sinks;                                           // [H]
//   headsum::Mha sliding(config, opt, weights);

struct MhaConfig {
  int64_t model_dim = 1, heads = 1, kv_heads = 0, head_dim = 1;  // kv_heads 0: = heads
  bool causal = true;
  float rope_theta = 0.0f;  // 0: no RoPE
  headsum_dtype weight_dtype = HEADSUM_F32, cache_dtype = HEADSUM_F32;

  headsum_mha_config c() const {
    headsum_mha_config config;
    config.model_dim = model_dim;
    config.heads = heads;
    config.kv_heads = kv_heads;
    config.head_dim = head_dim;
    config.causal = causal ? 1 : 0;
    config.rope_theta = rope_theta;
    config.weight_dtype = weight_dtype;
    config.cache_dtype = cache_dtype;
    return config;
  }
  int64_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
};

// The layer's weights (or one shard's slices), f32, x @ W; empty biases
// mean none.
struct MhaWeights {
  In wq, wk, wv, wo;
  In bq, bk, bv, bo;
};

// A KV cache of one layer (RAII over headsum_kv_cache).  Movable, not
// copyable; made by Mha::new_cache.
class KvCache {
 public:
  KvCache() = default;
  ~KvCache() { headsum_kv_cache_free(cache_); }
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  KvCache(KvCache&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)), batch_(other.batch_),
        capacity_(other.capacity_) {}
  KvCache& operator=(KvCache&& other) noexcept {
    std::swap(cache_, other.cache_);
    std::swap(batch_, other.batch_);
    std::swap(capacity_, other.capacity_);
    return *this;
  }

  int64_t length() const { return headsum_kv_cache_length(cache_); }  // tokens held
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  void reset() { headsum_kv_cache_reset(cache_); }
  headsum_kv_cache* get() const { return cache_; }

 private:
  friend class Mha;
  KvCache(headsum_kv_cache* cache, int64_t batch, int64_t capacity)
      : cache_(cache), batch_(batch), capacity_(capacity) {}
  headsum_kv_cache* cache_ = nullptr;
  int64_t batch_ = 0, capacity_ = 0;
};

// The whole attention layer, or one shard of its heads (RAII over
// headsum_mha).  Movable, not copyable.  forward() is const: one layer may
// serve many threads, each with its own cache.
class Mha {
 public:
  Mha(const MhaConfig& config, const MhaWeights& w) : config_(config) {
    check_weights("Mha", w, config.heads, config.kv());
    const headsum_mha_config c = config.c();
    check(headsum_mha_create(&c, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                             w.bq.data(), w.bk.data(), w.bv.data(), w.bo.data(), &mha_));
  }
  // With options (headsum_mha_create_ex): window, softcap, slopes and sinks
  // [H] are copied; a bias is refused.
  Mha(const MhaConfig& config, const AttnOptions& options, const MhaWeights& w)
      : config_(config) {
    check_weights("Mha", w, config.heads, config.kv());
    const headsum_mha_config c = config.c();
    const headsum_attn_options opt = layer_options("Mha", options);
    check(headsum_mha_create_ex(&c, &opt, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                                w.bq.data(), w.bk.data(), w.bv.data(), w.bo.data(), &mha_));
  }
  // Query heads [head_begin, head_end) (whole kv groups), from their own
  // slices only (headsum_mha_create_shard).
  static Mha shard(const MhaConfig& config, int64_t head_begin, int64_t head_end,
                   const MhaWeights& w) {
    Mha m = unmade_shard(config, head_begin, head_end, w);
    const headsum_mha_config c = config.c();
    check(headsum_mha_create_shard(&c, head_begin, head_end, w.wq.data(), w.wk.data(),
                                   w.wv.data(), w.wo.data(), w.bq.data(), w.bk.data(),
                                   w.bv.data(), w.bo.data(), &m.mha_));
    return m;
  }
  // A shard with options (headsum_mha_create_shard_ex): `options` holds the
  // whole layer's slopes and sinks [config.heads]; the shard keeps its
  // heads' slice.
  static Mha shard(const MhaConfig& config, const AttnOptions& options, int64_t head_begin,
                   int64_t head_end, const MhaWeights& w) {
    Mha m = unmade_shard(config, head_begin, head_end, w);
    const headsum_mha_config c = config.c();
    const headsum_attn_options opt = m.layer_options("Mha::shard", options);
    check(headsum_mha_create_shard_ex(&c, &opt, head_begin, head_end, w.wq.data(), w.wk.data(),
                                      w.wv.data(), w.wo.data(), w.bq.data(), w.bk.data(),
                                      w.bv.data(), w.bo.data(), &m.mha_));
    return m;
  }
  ~Mha() { headsum_mha_free(mha_); }
  Mha(const Mha&) = delete;
  Mha& operator=(const Mha&) = delete;
  Mha(Mha&& other) noexcept
      : mha_(std::exchange(other.mha_, nullptr)), config_(other.config_) {}
  Mha& operator=(Mha&& other) noexcept {
    std::swap(mha_, other.mha_);
    std::swap(config_, other.config_);
    return *this;
  }

  KvCache new_cache(int64_t batch, int64_t capacity) const {
    headsum_kv_cache* cache = nullptr;
    check(headsum_kv_cache_create(mha_, batch, capacity, &cache));
    return KvCache(cache, batch, capacity);
  }
  // y [B][S][Dm] from x [B][S][Dm], appending to `cache`.
  void forward(KvCache& cache, int64_t batch, int64_t seq, In x, Out y) const {
    run("Mha::forward", cache.get(), batch, seq, x, y);
  }
  // Self-attention over x alone (no cache), positions 0 .. S-1.
  void forward(int64_t batch, int64_t seq, In x, Out y) const {
    run("Mha::forward", nullptr, batch, seq, x, y);
  }
  const MhaConfig& config() const { return config_; }
  const headsum_mha* get() const { return mha_; }

 private:
  Mha() = default;
  // A shard not yet created: its config, its weights' sizes checked for
  // heads [head_begin, head_end) (Mha::shard's two forms).
  static Mha unmade_shard(const MhaConfig& config, int64_t head_begin, int64_t head_end,
                          const MhaWeights& w) {
    Mha m;
    m.config_ = config;
    const int64_t group = config.kv() > 0 && config.heads % config.kv() == 0
                              ? config.heads / config.kv() : 1;
    const int64_t heads = head_end - head_begin;
    m.check_weights("Mha::shard", w, heads, heads / group);
    return m;
  }
  // Each weight holds what the shape needs (a NULL bias is fine).
  void check_weights(const char* fn, const MhaWeights& w, int64_t heads,
                     int64_t kv_heads) const {
    const int64_t Dm = config_.model_dim, L = config_.head_dim;
    detail::expect(fn, "wq", w.wq, detail::count(Dm, heads, L));
    detail::expect(fn, "wk", w.wk, detail::count(Dm, kv_heads, L));
    detail::expect(fn, "wv", w.wv, detail::count(Dm, kv_heads, L));
    detail::expect(fn, "wo", w.wo, detail::count(heads, L, Dm));
    detail::expect(fn, "bq", w.bq, detail::count(heads, L));
    detail::expect(fn, "bk", w.bk, detail::count(kv_heads, L));
    detail::expect(fn, "bv", w.bv, detail::count(kv_heads, L));
    detail::expect(fn, "bo", w.bo, detail::count(Dm, 1));
  }
  // The layer's options as the C call takes them: slopes and sinks hold the
  // whole layer's H; a bias is passed on, for the C call to refuse by name.
  headsum_attn_options layer_options(const char* fn, const AttnOptions& o) const {
    detail::expect(fn, "alibi_slopes", o.alibi_slopes, detail::count(config_.heads, 1));
    detail::expect(fn, "sinks", o.sinks, detail::count(config_.heads, 1));
    headsum_attn_options c;
    c.window = o.window;
    c.softcap = o.softcap;
    c.alibi_slopes = o.alibi_slopes.size() != 0 ? o.alibi_slopes.data() : nullptr;
    c.sinks = o.sinks.size() != 0 ? o.sinks.data() : nullptr;
    c.bias = o.bias.present() ? &o.bias.view : nullptr;
    return c;
  }
  void run(const char* fn, headsum_kv_cache* cache, int64_t batch, int64_t seq, In x,
           Out y) const {
    const size_t n = detail::count(batch, seq, config_.model_dim);
    detail::expect(fn, "x", x, n);
    detail::expect(fn, "y", y, n);
    check(headsum_mha_forward(mha_, cache, batch, seq, x.data(), y.data()));
  }

  headsum_mha* mha_ = nullptr;
  MhaConfig config_;
};

}  // namespace headsum

#endif  // HEADSUM_HEADSUM_HPP_
