// libFuzzer harness over the C API.  The input decodes to one call: which
// function, a shape (dims from a table of hostile values or raw bytes: 0,
// negative, huge, products that overflow int64 and size_t), kv_heads, a
// scale (NaN, +-Inf, negative...), which pointers are NULL, a target name
// and a thread count.  The harness computes on its own, in 128-bit
// arithmetic, whether the call is valid, and checks:
//   - an invalid call returns HEADSUM_ERR_INVALID_ARGUMENT with a message and
//     leaves every output untouched (sentinel-filled);
//   - a valid call with small enough buffers (allocated at their exact size,
//     so ASan sees any access past them) returns HEADSUM_OK, writes finite
//     numbers from finite inputs and never touches memory it should not.
// Valid calls too large to allocate are not made.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "headsum/headsum.h"

namespace {

constexpr float kSentinel = 12345.0f;
constexpr __int128 kMaxElements = static_cast<__int128>(PTRDIFF_MAX) / 4;
constexpr __int128 kMaxRealElements = 1 << 15;  // buffers the harness allocates

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | Byte();
    return v;
  }
  // Mostly small dims (so real calls happen), sometimes hostile ones.
  int64_t Dim() {
    static const int64_t kHostile[] = {0, -1, -7, INT64_MIN, INT64_MAX, int64_t{1} << 31,
                                       int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 62,
                                       int64_t{3037000500}, 65, 130, 1000};
    const uint8_t sel = Byte();
    if (sel < 200) return 1 + sel % 19;
    if (sel < 240) return kHostile[sel % (sizeof(kHostile) / sizeof(kHostile[0]))];
    return static_cast<int64_t>(U64());
  }
  float Scale() {
    static const float kScales[] = {0.0f, 0.125f, -0.5f, 1e30f, NAN, INFINITY, -INFINITY, 1e-30f};
    const uint8_t sel = Byte();
    if (sel < 128) return 0.0f;
    return kScales[sel % 8];
  }
  float Value() { return (static_cast<int>(Byte()) - 128) / 32.0f; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

__int128 Product(std::initializer_list<int64_t> dims) {
  __int128 n = 1;
  for (int64_t d : dims) {
    if (d < 1) return -1;
    n *= d;
    if (n > kMaxElements) return kMaxElements + 1;  // saturate: too large either way
  }
  return n;
}

struct Buffer {
  std::vector<float> storage;  // exact size: ASan flags any access past it
  bool null = false;
  float* get() { return null ? nullptr : (storage.empty() ? dummy() : storage.data()); }
  static float* dummy() {
    static float d[1];
    return d;
  }
};

void FillInput(Buffer& b, __int128 n, Input& in) {
  b.storage.resize(static_cast<size_t>(n));
  for (float& x : b.storage) x = in.Value();
}

void FillOutput(Buffer& b, __int128 n) { b.storage.assign(static_cast<size_t>(n), kSentinel); }

bool Untouched(const Buffer& b) {
  for (float x : b.storage) {
    if (memcmp(&x, &kSentinel, sizeof(float)) != 0) return false;
  }
  return true;
}

bool AllFinite(const Buffer& b) {
  for (float x : b.storage) {
    if (!isfinite(x)) return false;
  }
  return true;
}

[[noreturn]] void Finding(const char* what, int fn, headsum_status status) {
  fprintf(stderr, "FINDING: %s (function %d, status %d, message '%s')\n", what, fn,
          static_cast<int>(status), headsum_last_error());
  abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int fn = in.Byte() % 12;
  const uint8_t nulls = in.Byte();
  const bool null_ptr = (nulls & 0xE0) == 0xE0;  // one pointer NULL, 1 in 8
  const int which_null = nulls % 5;

  // Target and threads: exercised on every input.
  const char* names[16];
  const int n_targets = headsum_compiled_targets(names, 16);
  const uint8_t t = in.Byte();
  if (t < 16 && t < n_targets) {
    if (headsum_set_target(names[t]) != HEADSUM_OK && headsum_last_error()[0] == '\0')
      Finding("set_target failed without a message", -1, HEADSUM_ERR_UNSUPPORTED);
  } else if (t == 200) {
    if (headsum_set_target("NOT_A_TARGET") != HEADSUM_ERR_UNSUPPORTED)
      Finding("unknown target accepted", -1, HEADSUM_OK);
  } else if (t > 240) {
    headsum_set_target(nullptr);
  }
  const int threads = static_cast<int8_t>(in.Byte()) % 5;
  if ((headsum_set_num_threads(threads) == HEADSUM_OK) != (threads >= 0))
    Finding("set_num_threads accepted a negative count or refused a valid one", -1, HEADSUM_OK);

  if (fn < 6) {  // attention family (3 headsum + 3 oneDNN twins)
    headsum_attn_shape s;
    s.batch = in.Dim(); s.heads = in.Dim(); s.seq_q = in.Dim(); s.seq_kv = in.Dim();
    s.head_dim = in.Dim();
    const uint8_t kvsel = in.Byte();
    s.kv_heads = kvsel < 100 ? 0 : kvsel < 200 ? 1 + kvsel % 4 : (kvsel < 230 ? -1 : in.Dim());
    s.scale = in.Scale();
    s.causal = in.Byte() & 1;
    const int64_t kv = s.kv_heads == 0 ? s.heads : s.kv_heads;
    const __int128 nq = Product({s.batch, s.heads, s.seq_q, s.head_dim});
    const __int128 nkv = Product({s.batch, kv, s.seq_kv, s.head_dim});
    const __int128 ns = Product({s.batch, s.heads, s.seq_q, s.seq_kv});
    bool valid = nq > 0 && nkv > 0 && ns > 0 && s.kv_heads >= 0 && kv >= 1 &&
                 s.heads % kv == 0 &&
                 isfinite(s.scale) && nq <= kMaxElements && nkv <= kMaxElements &&
                 ns <= kMaxElements;
    valid = valid && !null_ptr;
    if (getenv("HEADSUM_FUZZ_VERBOSE")) {
      fprintf(stderr, "fn %d B %lld H %lld Hkv %lld Sq %lld Skv %lld L %lld scale %g causal %d null %d target %s threads %d\n",
              fn, (long long)s.batch, (long long)s.heads, (long long)s.kv_heads, (long long)s.seq_q,
              (long long)s.seq_kv, (long long)s.head_dim, (double)s.scale, s.causal,
              null_ptr ? which_null : -1, headsum_active_target(), threads);
    }
    const bool small = nq <= kMaxRealElements && nkv <= kMaxRealElements && ns <= kMaxRealElements;
    if (valid && !small) return 0;  // a real call we cannot afford here
    Buffer a, b, c, out;
    const bool real = valid;
    const int kind = fn % 3;  // 0 qk_scores, 1 softmax_v, 2 attention
    const __int128 n_out = kind == 0 ? ns : nq;
    if (real) {
      FillInput(a, kind == 1 ? ns : nq, in);
      FillInput(b, nkv, in);
      if (kind == 2) FillInput(c, nkv, in);
      FillOutput(out, n_out);
    } else if (n_out > 0 && n_out <= kMaxRealElements) {
      FillOutput(out, n_out);
    } else {
      FillOutput(out, 64);
    }
    Buffer* ptrs[4] = {&a, &b, kind == 2 ? &c : &out, &out};
    if (null_ptr) ptrs[which_null % (kind == 2 ? 4 : 3)]->null = true;
    headsum_status st;
    const bool onednn = fn >= 3;
    if (kind == 0) {
      st = onednn ? headsum_qk_scores_onednn(&s, a.get(), b.get(), out.get())
                  : headsum_qk_scores(&s, a.get(), b.get(), out.get());
    } else if (kind == 1) {
      st = onednn ? headsum_softmax_v_onednn(&s, a.get(), b.get(), out.get())
                  : headsum_softmax_v(&s, a.get(), b.get(), out.get());
    } else {
      st = onednn ? headsum_attention_onednn(&s, a.get(), b.get(), c.get(), out.get())
                  : headsum_attention(&s, a.get(), b.get(), c.get(), out.get());
    }
    if (!real) {
      if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid call not refused", fn, st);
      if (headsum_last_error()[0] == '\0') Finding("refused without a message", fn, st);
      if (!Untouched(out)) Finding("output written on failure", fn, st);
    } else if (onednn && st == HEADSUM_ERR_UNSUPPORTED) {
      if (!Untouched(out)) Finding("output written on failure", fn, st);
    } else if (st != HEADSUM_OK) {
      Finding("valid call failed", fn, st);
    } else if (kind != 0 && fabsf(s.scale) < 1e3f && !AllFinite(out)) {
      Finding("non-finite output from finite inputs", fn, st);
    }
    return 0;
  }

  // Projection family.
  headsum_proj_shape p;
  p.batch = in.Dim(); p.seq = in.Dim(); p.heads = in.Dim(); p.head_dim = in.Dim();
  p.model_dim = in.Dim();
  const int64_t R = fn == 9 ? (in.Byte() < 230 ? 1 + in.Byte() % 3 : in.Dim()) : 1;
  const __int128 nh = Product({p.batch, p.heads, p.seq, p.head_dim});
  const __int128 nw = Product({p.heads, p.head_dim, p.model_dim});
  const __int128 ny = Product({p.batch, p.seq, p.model_dim});
  const __int128 nph = Product({p.batch, p.seq, p.heads, p.model_dim});
  const __int128 nd = Product({R, p.model_dim});
  const __int128 nattr = Product({p.batch, p.seq, p.heads, R});
  const __int128 nbasis = Product({p.heads, p.head_dim, R});
  bool valid = nh > 0 && nw > 0 && ny > 0 && nh <= kMaxElements && nw <= kMaxElements &&
               ny <= kMaxElements;
  __int128 n_out = ny;
  if (fn == 8) {  // _ex with per_head
    valid = valid && nph > 0 && nph <= kMaxElements;
    n_out = nph;
  } else if (fn == 9) {
    valid = valid && nd > 0 && nattr > 0 && nbasis > 0 && nd <= kMaxElements &&
            nattr <= kMaxElements && nbasis <= kMaxElements;
    n_out = nattr;
  } else if (fn == 10) {
    n_out = Product({p.batch, p.seq, p.heads});
  }
  valid = valid && !null_ptr;
  const bool small = nh <= kMaxRealElements && nw <= kMaxRealElements &&
                     ny <= kMaxRealElements && (fn != 8 || nph <= kMaxRealElements) &&
                     (fn != 9 || (nd <= kMaxRealElements && nattr <= kMaxRealElements));
  if (valid && !small) return 0;
  Buffer heads, wo, extra, out, bias, gates;
  if (valid) {
    FillInput(heads, nh, in);
    FillInput(wo, nw, in);
    FillInput(bias, Product({p.model_dim}), in);
    FillInput(gates, Product({p.heads}), in);
    if (fn == 9) FillInput(extra, nd, in);
    FillOutput(out, n_out);
  } else {
    FillOutput(out, n_out > 0 && n_out <= kMaxRealElements ? n_out : 64);
  }
  Buffer* ptrs[4] = {&heads, &wo, fn == 9 ? &extra : &out, &out};
  if (null_ptr) ptrs[which_null % (fn == 9 ? 4 : 3)]->null = true;
  const uint8_t flags = in.Byte();
  const bool use_bias = flags & 1;
  const bool use_packed_wo = flags & 2;  // fn 6 through headsum_wo_pack
  headsum_status st;
  switch (fn) {
    case 6:
      // Only valid calls pack: an invalid one may hold a 1-float stand-in for
      // wo that wo_pack would rightly read in full when only heads is at fault.
      if (use_packed_wo && valid) {
        headsum_wo_packed* packed = nullptr;
        st = headsum_wo_pack(&p, wo.get(), &packed);
        if (st == HEADSUM_OK) {
          st = headsum_project_heads_sum_packed(&p, heads.get(), packed,
                                                use_bias ? bias.get() : nullptr, out.get());
          headsum_wo_free(packed);
        } else if (packed != nullptr) {
          Finding("wo_pack failed and wrote its handle", fn, st);
        }
      } else {
        st = headsum_project_heads_sum(&p, heads.get(), wo.get(), use_bias ? bias.get() : nullptr, out.get());
      }
      break;
    case 7: st = headsum_concat_project_onednn(&p, heads.get(), wo.get(), use_bias ? bias.get() : nullptr, out.get()); break;
    case 8: st = headsum_project_heads_sum_ex(&p, heads.get(), wo.get(), use_bias ? bias.get() : nullptr, gates.get(), nullptr, out.get()); break;
    case 9: st = headsum_head_attribution(&p, heads.get(), wo.get(), extra.get(), R, out.get()); break;
    case 10: st = headsum_head_contribution_norms(&p, heads.get(), wo.get(), out.get()); break;
    default: st = headsum_project_heads_sum_ex(&p, heads.get(), wo.get(), nullptr, nullptr, nullptr, nullptr);
             if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("_ex with no output accepted", fn, st);
             return 0;
  }
  if (!valid) {
    if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid call not refused", fn, st);
    if (headsum_last_error()[0] == '\0') Finding("refused without a message", fn, st);
    if (!Untouched(out)) Finding("output written on failure", fn, st);
  } else if (fn == 7 && st == HEADSUM_ERR_UNSUPPORTED) {
    if (!Untouched(out)) Finding("output written on failure", fn, st);
  } else if (st != HEADSUM_OK) {
    Finding("valid call failed", fn, st);
  } else if (!AllFinite(out)) {
    Finding("non-finite output from finite inputs", fn, st);
  }
  return 0;
}
