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

 private:
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

}  // namespace headsum

#endif  // HEADSUM_HEADSUM_HPP_
