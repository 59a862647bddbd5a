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
//
// The tensor API (fn 12-14: attention, projection (plain or packed) and
// convert on headsum_tensor views) gets views into one shared arena: dtypes
// (sometimes not a headsum_dtype), strides (natural, perturbed, 0, negative,
// huge), offsets (sometimes misaligned, sometimes overlapping another view).
// The harness decides validity on its own (128-bit range arithmetic, an
// exhaustive search for output indices that meet) and checks refusals leave
// the arena untouched and valid calls succeed, touch nothing outside the
// output view, and give finite outputs from finite inputs.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
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

namespace {

// ---------------------------------------------------------------------------
// The tensor API.

constexpr size_t kArenaBytes = 1 << 16;

struct View {
  headsum_tensor t;
  int dtype_int;  // as stored
  int64_t dims[4];
  bool uses[3];
  bool valid_alone = false;   // its own rules hold
  bool fits = false;          // every byte it spans lies in the arena
  __int128 lo = 0, hi = 0;    // byte offsets into the arena, inclusive
};

int ElementBytes(int dtype) { return dtype == 0 ? 4 : 2; }

// Fills a view of `dims` at a fuzzed offset into `arena` with fuzzed dtype
// and strides, and decides its own validity.
void MakeView(Input& in, uint8_t* arena, const int64_t dims[4], const bool uses[3], View* v) {
  for (int i = 0; i < 4; ++i) v->dims[i] = dims[i];
  for (int i = 0; i < 3; ++i) v->uses[i] = uses[i];
  const uint8_t dsel = in.Byte();
  v->dtype_int = dsel < 240 ? dsel % 3 : (dsel < 248 ? 3 + dsel % 5 : -1 - dsel % 3);
  memcpy(&v->t.dtype, &v->dtype_int, sizeof(int));
  const int eb = ElementBytes(v->dtype_int);
  // natural strides: bhsd or bshd, then perturbations
  const bool token_major = in.Byte() & 1;
  int64_t st[3];
  if (token_major) {
    st[0] = dims[2] * dims[1] * dims[3]; st[1] = dims[3]; st[2] = dims[1] * dims[3];
  } else {
    st[0] = dims[1] * dims[2] * dims[3]; st[1] = dims[2] * dims[3]; st[2] = dims[3];
  }
  for (int i = 0; i < 3; ++i) {
    const uint8_t p = in.Byte();
    if (p < 200) continue;
    static const int64_t kOdd[] = {0, 1, -1, 3, 1000, INT64_MAX / 2, INT64_MIN, 17};
    st[i] = p < 230 ? st[i] + (p % 5) : kOdd[p % 8];
  }
  for (int i = 0; i < 3; ++i) v->t.strides[i] = st[i];
  const uint32_t off = (static_cast<uint32_t>(in.Byte()) << 8 | in.Byte()) % kArenaBytes;
  v->t.data = arena + off;
  if (in.Byte() > 250) v->t.data = nullptr;
  bool ok = v->t.data != nullptr && v->dtype_int >= 0 && v->dtype_int <= 2;
  __int128 last = 0;
  for (int i = 0; i < 3 && ok; ++i) {
    if (!uses[i]) continue;
    ok = st[i] >= 0;
    last += static_cast<__int128>(dims[i] - 1) * st[i];
  }
  last += dims[3] - 1;
  ok = ok && off % eb == 0;
  const __int128 span = (last + 1) * eb;
  // address arithmetic: the span must stay within PTRDIFF_MAX and the address space
  ok = ok && span <= static_cast<__int128>(PTRDIFF_MAX) &&
       static_cast<__int128>(reinterpret_cast<uintptr_t>(v->t.data)) + span <=
           static_cast<__int128>(UINTPTR_MAX);
  v->lo = off;
  v->hi = off + span - 1;
  v->fits = v->hi < static_cast<__int128>(kArenaBytes);
  v->valid_alone = ok;
}

// Whether two indices of the output view reach one element: exhaustive over
// its element offsets (the views here are small).
bool OutputAliases(const View& v) {
  std::vector<__int128> offs;
  const int64_t s0 = v.uses[0] ? v.t.strides[0] : 0, s1 = v.uses[1] ? v.t.strides[1] : 0,
                s2 = v.uses[2] ? v.t.strides[2] : 0;
  for (int64_t b = 0; b < v.dims[0]; ++b)
    for (int64_t h = 0; h < v.dims[1]; ++h)
      for (int64_t s = 0; s < v.dims[2]; ++s)
        for (int64_t l = 0; l < v.dims[3]; ++l)
          offs.push_back(static_cast<__int128>(b) * s0 + static_cast<__int128>(h) * s1 +
                         static_cast<__int128>(s) * s2 + l);
  std::sort(offs.begin(), offs.end());
  return std::adjacent_find(offs.begin(), offs.end()) != offs.end();
}

bool Meets(const View& a, const View& b) { return a.lo <= b.hi && b.lo <= a.hi; }

// Small dims only: the tensor views live in a 64 KiB arena.
int64_t SmallDim(Input& in) {
  const uint8_t sel = in.Byte();
  if (sel < 250) return 1 + sel % 9;
  return sel == 250 ? 0 : -1;
}

// A query length that sometimes spans two 64-row blocks (65-68): strided
// K/V of such a prefill are copied per kv head into the thread's scratch.
int64_t SmallSeq(Input& in) {
  const uint8_t sel = in.Byte();
  if (sel >= 230 && sel < 250) return 65 + sel % 4;
  return sel < 250 ? 1 + sel % 9 : sel == 250 ? 0 : -1;
}

int FuzzTensors(int fn, Input& in) {
  static std::vector<uint8_t> arena(kArenaBytes);
  for (uint8_t& b : arena) b = in.Byte() & 0x3F;  // finite values of every dtype
  for (size_t i = 0; i < kArenaBytes; i += 2) arena[i + 1] &= 0x3F;
  const std::vector<uint8_t> before = arena;
  headsum_status st;
  bool valid;
  std::vector<View> outs, ins;
  if (fn == 12) {  // attention
    headsum_attn_shape s = {SmallDim(in), SmallDim(in), 0, SmallSeq(in), SmallSeq(in),
                            SmallDim(in), in.Scale(), in.Byte() & 1};
    const uint8_t kvsel = in.Byte();
    s.kv_heads = kvsel < 128 ? 0 : kvsel < 250 ? 1 + kvsel % 3 : -1;
    const int64_t kv = s.kv_heads == 0 ? s.heads : s.kv_heads;
    const bool shape_ok = s.batch > 0 && s.heads > 0 && s.seq_q > 0 && s.seq_kv > 0 &&
                          s.head_dim > 0 && s.kv_heads >= 0 && kv > 0 && s.heads % kv == 0 &&
                          isfinite(s.scale);
    if (!shape_ok) {
      View q;
      const int64_t d1[4] = {1, 1, 1, 1};
      const bool all[3] = {true, true, true};
      MakeView(in, arena.data(), d1, all, &q);
      st = headsum_attention_tensors(&s, &q.t, &q.t, &q.t, &q.t);
      if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid shape not refused", fn, st);
      if (arena != before) Finding("output written on failure", fn, st);
      return 0;
    }
    const int64_t qd[4] = {s.batch, s.heads, s.seq_q, s.head_dim};
    const int64_t kd[4] = {s.batch, kv, s.seq_kv, s.head_dim};
    const bool all[3] = {true, true, true};
    View q, k, v, o;
    MakeView(in, arena.data(), qd, all, &q);
    MakeView(in, arena.data(), kd, all, &k);
    MakeView(in, arena.data(), kd, all, &v);
    MakeView(in, arena.data(), qd, all, &o);
    valid = q.valid_alone && k.valid_alone && v.valid_alone && o.valid_alone &&
            !OutputAliases(o) && !Meets(o, q) && !Meets(o, k) && !Meets(o, v);
    if (valid && !(q.fits && k.fits && v.fits && o.fits)) return 0;
    const bool null_tensor = in.Byte() > 250;
    if (null_tensor) valid = false;
    st = headsum_attention_tensors(&s, &q.t, &k.t, &v.t, null_tensor ? nullptr : &o.t);
    outs.push_back(o);
  } else if (fn == 13) {  // projection, plain or packed
    headsum_proj_shape p = {SmallDim(in), SmallDim(in), SmallDim(in), SmallDim(in),
                            SmallDim(in)};
    const bool shape_ok = p.batch > 0 && p.seq > 0 && p.heads > 0 && p.head_dim > 0 &&
                          p.model_dim > 0;
    const int64_t od[4] = {p.batch, p.heads, p.seq, p.head_dim};
    const int64_t wd[4] = {1, 1, p.heads * p.head_dim, p.model_dim};
    const int64_t yd[4] = {p.batch, 1, p.seq, p.model_dim};
    const bool all[3] = {true, true, true}, row[3] = {false, false, true},
               y_uses[3] = {true, false, true};
    View o, w, y;
    const int64_t one[4] = {1, 1, 1, 1};
    MakeView(in, arena.data(), shape_ok ? od : one, all, &o);
    MakeView(in, arena.data(), shape_ok ? wd : one, row, &w);
    MakeView(in, arena.data(), shape_ok ? yd : one, y_uses, &y);
    valid = shape_ok && o.valid_alone && w.valid_alone && y.valid_alone && !OutputAliases(y) &&
            !Meets(y, o) && !Meets(y, w);
    if (valid && !(o.fits && w.fits && y.fits)) return 0;
    if (!shape_ok) {
      st = headsum_project_heads_sum_tensors(&p, &o.t, &w.t, nullptr, &y.t);
    } else if ((in.Byte() & 1) && w.valid_alone && w.fits) {
      headsum_wo_packed* packed = nullptr;
      st = headsum_wo_pack_tensor(&p, &w.t, &packed);
      if (st != HEADSUM_OK) Finding("wo_pack_tensor refused a valid wo", fn, st);
      valid = shape_ok && o.valid_alone && y.valid_alone && !OutputAliases(y) && !Meets(y, o);
      if (valid && !(o.fits && y.fits)) {
        headsum_wo_free(packed);
        return 0;
      }
      st = headsum_project_heads_sum_packed_tensors(&p, &o.t, packed, nullptr, &y.t);
      headsum_wo_free(packed);
    } else {
      st = headsum_project_heads_sum_tensors(&p, &o.t, &w.t, nullptr, &y.t);
    }
    outs.push_back(y);
  } else {  // convert
    const int64_t dims[4] = {SmallDim(in), SmallDim(in), SmallDim(in), SmallDim(in)};
    const bool shape_ok = dims[0] > 0 && dims[1] > 0 && dims[2] > 0 && dims[3] > 0;
    const int64_t one[4] = {1, 1, 1, 1};
    const bool all[3] = {true, true, true};
    View src, dst;
    MakeView(in, arena.data(), shape_ok ? dims : one, all, &src);
    MakeView(in, arena.data(), shape_ok ? dims : one, all, &dst);
    valid = shape_ok && src.valid_alone && dst.valid_alone && !OutputAliases(dst) &&
            !Meets(dst, src);
    if (valid && !(src.fits && dst.fits)) return 0;
    st = headsum_convert(dims, &src.t, &dst.t);
    outs.push_back(dst);
  }
  if (!valid) {
    if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid tensor call not refused", fn, st);
    if (headsum_last_error()[0] == '\0') Finding("refused without a message", fn, st);
    if (arena != before) Finding("output written on failure", fn, st);
    return 0;
  }
  if (st != HEADSUM_OK) Finding("valid tensor call failed", fn, st);
  // Only the output view's bytes may change; its elements are finite.
  const View& o = outs[0];
  std::vector<bool> in_view(kArenaBytes, false);
  const int eb = ElementBytes(o.dtype_int);
  const uintptr_t base = reinterpret_cast<uintptr_t>(o.t.data) -
                         reinterpret_cast<uintptr_t>(arena.data());
  for (int64_t b = 0; b < o.dims[0]; ++b)
    for (int64_t h = 0; h < o.dims[1]; ++h)
      for (int64_t s = 0; s < o.dims[2]; ++s)
        for (int64_t l = 0; l < o.dims[3]; ++l) {
          const size_t at = base + static_cast<size_t>(
              ((o.uses[0] ? b * o.t.strides[0] : 0) + (o.uses[1] ? h * o.t.strides[1] : 0) +
               (o.uses[2] ? s * o.t.strides[2] : 0) + l) * eb);
          for (int i = 0; i < eb; ++i) in_view[at + i] = true;
          if (eb == 4) {
            float x;
            memcpy(&x, &arena[at], 4);
            if (!isfinite(x)) Finding("non-finite f32 output from finite inputs", fn, st);
          } else {
            uint16_t x;
            memcpy(&x, &arena[at], 2);
            const uint16_t exp_mask = o.dtype_int == 1 ? 0x7C00 : 0x7F80;
            // f16 may overflow to inf from finite inputs; NaN never.
            if ((x & exp_mask) == exp_mask && (x & ~(exp_mask | 0x8000)) != 0)
              Finding("NaN 16-bit output from finite inputs", fn, st);
          }
        }
  for (size_t i = 0; i < kArenaBytes; ++i) {
    if (!in_view[i] && arena[i] != before[i]) Finding("wrote outside the output view", fn, st);
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int fn = in.Byte() % 15;
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

  if (fn >= 12) return FuzzTensors(fn, in);

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
