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
// output view, and give finite outputs from finite inputs.  The arena's
// values come from a generator seeded by two input bytes (every value finite
// in every dtype), so the rest of the input decodes the call.
//
// The calls for the models engines run (DESIGN.md "Attention for the models
// engines run"), validity decided here from its rules:
//   fn 15 headsum_attention_tensors_ex: fn 12's views plus options (NULL or
//     fuzzed): window (0, small, huge, negative), softcap (0, positive,
//     negative, NaN, inf, denormal), ALiBi slopes and sinks (NULL or exact
//     [H] arrays with finite, NaN or inf entries), a bias view in the arena
//     (any dtype, 0 strides that broadcast, perturbed strides, misaligned,
//     sometimes placed on out: a bias meeting out is invalid, headsum.h)
//     with -inf (rows may see no key: zeros) or inf/NaN poked in.
//   fn 16 headsum_attention_paged and fn 17 headsum_paged_kv_write: ragged
//     q_offsets (not from 0, decreasing, INT64_MIN/MAX), kv_lens (negative,
//     < n_b, past blocks_per_seq * block_size, huge), hostile block_size,
//     num_blocks and blocks_per_seq, block tables with shared and
//     out-of-range entries, allocated sometimes exactly up to the last entry
//     a call may read (ASan sees a read past it: entries past a sequence's
//     blocks, and for a write those of blocks not written, are never read);
//     K and V pools in the arena (V on K, a few bytes off, interleaved, apart)
//     or in exact separate buffers; q/out (k_new/v_new) token rows placed
//     near the pools.  Pools are inputs of the attention (K and V may alias;
//     out must meet neither); a write's pools are its outputs: their byte
//     ranges must not meet k_new or v_new, and no two written elements (K and
//     V, every head) may share a byte ("destination slots that meet").  A
//     valid write must change exactly its destinations, to the new rows
//     converted here (f32 -> f16/bf16 to nearest even).
// Where the docs are silent the harness follows dispatch/ (said where):
// with no query rows (T = 0) q and out (k_new, v_new) are not looked at;
// num_blocks and blocks_per_seq must be >= 1; a paged bias is
// [B][H][max n_b][max kv_lens] (each at least 1); the batch shape's rules
// (finite scale, kv_heads dividing heads) hold for a write too.
// HEADSUM_FUZZ_VERBOSE=1 prints one line per call of fn 15-17 (valid,
// called, and for 16-17 the first rule broken).
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
  bool fits = false;          // every byte it spans lies in its space
  int space = 0;              // 0: the arena; others: separate buffers
  __int128 lo = 0, hi = 0;    // byte offsets into its space, inclusive
};

int ElementBytes(int dtype) { return dtype == 0 ? 4 : 2; }

int64_t Clamp64(__int128 x) {
  return x > INT64_MAX ? INT64_MAX : x < INT64_MIN ? INT64_MIN : static_cast<int64_t>(x);
}

// Decides a view's own validity from its fields: data at `base + offset`
// of a space of `space_bytes` (the arena or a separate buffer).
void Measure(View* v, const uint8_t* base, size_t space_bytes, int space) {
  const int eb = ElementBytes(v->dtype_int);
  const __int128 off = v->t.data == nullptr
                           ? v->lo
                           : static_cast<__int128>(reinterpret_cast<uintptr_t>(v->t.data)) -
                                 static_cast<__int128>(reinterpret_cast<uintptr_t>(base));
  bool ok = v->t.data != nullptr && v->dtype_int >= 0 && v->dtype_int <= 2;
  // Saturating: the terms reach 2^126, their sum is capped far past PTRDIFF_MAX.
  const __int128 kCap = static_cast<__int128>(1) << 100;
  __int128 last = 0;
  for (int i = 0; i < 3 && ok; ++i) {
    if (!v->uses[i]) continue;
    ok = v->t.strides[i] >= 0;
    last += static_cast<__int128>(v->dims[i] - 1) * v->t.strides[i];
    if (last > kCap) last = kCap;
  }
  last += v->dims[3] - 1;
  if (last > kCap) last = kCap;
  ok = ok && static_cast<uint64_t>(reinterpret_cast<uintptr_t>(v->t.data)) % eb == 0;
  const __int128 span = (last + 1) * eb;
  // address arithmetic: the span must stay within PTRDIFF_MAX and the address space
  ok = ok && span <= static_cast<__int128>(PTRDIFF_MAX) &&
       static_cast<__int128>(reinterpret_cast<uintptr_t>(v->t.data)) + span <=
           static_cast<__int128>(UINTPTR_MAX);
  v->space = space;
  v->lo = off;
  v->hi = off + span - 1;
  v->fits = off >= 0 && v->hi < static_cast<__int128>(space_bytes);
  v->valid_alone = ok;
}

// Fills a view of `dims` at a fuzzed offset into `arena` with fuzzed dtype
// and strides, and decides its own validity.  zero_mask: strides set to 0
// first (a broadcast bias); near: sometimes placed a few bytes from it.
void MakeView(Input& in, uint8_t* arena, const int64_t dims[4], const bool uses[3], View* v,
              unsigned zero_mask = 0, const View* near = nullptr) {
  for (int i = 0; i < 4; ++i) v->dims[i] = dims[i];
  for (int i = 0; i < 3; ++i) v->uses[i] = uses[i];
  const uint8_t dsel = in.Byte();
  v->dtype_int = dsel < 240 ? dsel % 3 : (dsel < 248 ? 3 + dsel % 5 : -1 - dsel % 3);
  memcpy(&v->t.dtype, &v->dtype_int, sizeof(int));
  // natural strides: bhsd or bshd, then perturbations
  const bool token_major = in.Byte() & 1;
  const __int128 d1 = dims[1], d2 = dims[2], d3 = dims[3];
  int64_t st[3];
  if (token_major) {
    st[0] = Clamp64(d2 * d1 * d3); st[1] = dims[3]; st[2] = Clamp64(d1 * d3);
  } else {
    st[0] = Clamp64(d1 * d2 * d3); st[1] = Clamp64(d2 * d3); st[2] = dims[3];
  }
  for (int i = 0; i < 3; ++i) {
    if (zero_mask >> i & 1) st[i] = 0;
  }
  for (int i = 0; i < 3; ++i) {
    const uint8_t p = in.Byte();
    if (p < 200) continue;
    static const int64_t kOdd[] = {0, 1, -1, 3, 1000, INT64_MAX / 2, INT64_MIN, 17};
    st[i] = p < 230 ? Clamp64(static_cast<__int128>(st[i]) + (p % 5)) : kOdd[p % 8];
  }
  for (int i = 0; i < 3; ++i) v->t.strides[i] = st[i];
  uint32_t off = (static_cast<uint32_t>(in.Byte()) << 8 | in.Byte()) % kArenaBytes;
  if (near != nullptr && in.Byte() < 96) {  // a few bytes from another view: overlaps
    const int64_t at = static_cast<int64_t>(near->lo) + static_cast<int>(in.Byte() % 129) - 64;
    off = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(at, 0), kArenaBytes - 1));
  }
  v->t.data = arena + off;
  if (in.Byte() > 250) v->t.data = nullptr;
  v->lo = off;
  Measure(v, arena, kArenaBytes, 0);
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

bool Meets(const View& a, const View& b) {
  return a.space == b.space && a.lo <= b.hi && b.lo <= a.hi;
}

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

// Bytes that read as finite values of every dtype (each byte below 0x40,
// so every f32, f16 and bf16 element is finite; their signs come from a
// 0x80 set in some odd-addressed bytes), drawn from a generator seeded by
// two input bytes: filling 64 KiB from the input itself would consume far
// more than libFuzzer's inputs hold (-max_len 4096), leaving every byte
// after it, the dims and strides included, zero.
void FillBytes(std::vector<uint8_t>& bytes, Input& in) {
  uint32_t state = 0x9E3779B9u ^ (static_cast<uint32_t>(in.Byte()) << 8 | in.Byte());
  for (size_t i = 0; i < bytes.size(); ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    bytes[i] = static_cast<uint8_t>(state >> 24) & 0x3F;
    if ((i & 1) && (state & 0x100)) bytes[i] |= 0x80;  // a sign (f32: a mantissa bit too)
  }
}

// A small attention shape from the input (fn 12 and 15), its resolved kv
// heads, and whether its own rules hold.
headsum_attn_shape SmallAttnShape(Input& in, int64_t* kv, bool* ok) {
  headsum_attn_shape s = {SmallDim(in), SmallDim(in), 0, SmallSeq(in), SmallSeq(in),
                          SmallDim(in), in.Scale(), in.Byte() & 1};
  const uint8_t kvsel = in.Byte();
  s.kv_heads = kvsel < 128 ? 0 : kvsel < 250 ? 1 + kvsel % 3 : -1;
  *kv = s.kv_heads == 0 ? s.heads : s.kv_heads;
  *ok = s.batch > 0 && s.heads > 0 && s.seq_q > 0 && s.seq_kv > 0 && s.head_dim > 0 &&
        s.kv_heads >= 0 && *kv > 0 && s.heads % *kv == 0 && isfinite(s.scale);
  return s;
}

int FuzzTensors(int fn, Input& in) {
  static std::vector<uint8_t> arena(kArenaBytes);
  FillBytes(arena, in);
  const std::vector<uint8_t> before = arena;
  headsum_status st;
  bool valid;
  std::vector<View> outs, ins;
  if (fn == 12) {  // attention
    int64_t kv;
    bool shape_ok;
    headsum_attn_shape s = SmallAttnShape(in, &kv, &shape_ok);
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

namespace {

// ---------------------------------------------------------------------------
// Attention for the models engines run (fn 15-17): options, ragged batches
// over a paged KV cache, and the paged write.  Validity decided here from
// DESIGN.md ("Attention for the models engines run") and headsum.h.

float DecodeElement(const uint8_t* p, int dtype) {
  if (dtype == 0) {
    float x;
    memcpy(&x, p, 4);
    return x;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  if (dtype == 2) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
  }
  const int e = h >> 10 & 0x1F, m = h & 0x3FF;
  double x = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return static_cast<float>(h & 0x8000 ? -x : x);
}

// Round to nearest even, computed here (finite inputs only).
void EncodeElement(float x, int dtype, uint8_t* p) {
  if (dtype == 0) {
    memcpy(p, &x, 4);
    return;
  }
  uint32_t u;
  memcpy(&u, &x, 4);
  uint16_t h;
  if (dtype == 2) {
    h = static_cast<uint16_t>((u + 0x7FFF + (u >> 16 & 1)) >> 16);
  } else {
    const uint16_t sign = u >> 31 ? 0x8000 : 0;
    const double a = fabs(static_cast<double>(x));
    if (a >= 65520.0) {
      h = sign | 0x7C00;
    } else if (a < ldexp(1.0, -14)) {
      h = sign | static_cast<uint16_t>(nearbyint(a * ldexp(1.0, 24)));  // 1024: the least normal
    } else {
      int ex;
      frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1)
      int e = ex - 1;
      double m = nearbyint((a / ldexp(1.0, e) - 1.0) * 1024.0);
      if (m == 1024.0) {
        m = 0;
        ++e;
      }
      h = sign | static_cast<uint16_t>((e + 15) << 10 | static_cast<int>(m));
    }
  }
  memcpy(p, &h, 2);
}

// A separate buffer (a pool outside the arena), exact size: ASan sees any
// access past it.
struct Space {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> before;
};

struct Options {
  headsum_attn_options o = {};
  bool null = true;
  std::vector<float> slopes, sinks;
  View bias;
  bool has_bias = false;
  bool valid_alone = true;   // every rule but the bias meeting out
  bool finite = true;        // finite outputs expected (given finite q, k, v)
  std::vector<__int128> poked;  // arena byte offsets of -inf written into the bias
};

float PerHead(Input& in) {
  static const float kOdd[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 0.0f, -0.0f, 1e-40f};
  const uint8_t sel = in.Byte();
  return sel < 220 ? (static_cast<int>(in.Byte()) - 128) / 64.0f : kOdd[sel % 8];
}

// Options over bias extents [nb][nh][ni][nj] (>= 1 each) and heads H.
void MakeOptions(Input& in, uint8_t* arena, int64_t heads, const int64_t bias_dims[4],
                 const View* near, Options* op) {
  if (in.Byte() < 48) return;  // options NULL
  op->null = false;
  static const int64_t kWindows[] = {64, INT64_MAX, int64_t{1} << 40, -1, INT64_MIN,
                                     3037000500, -7, 1000};
  const uint8_t w = in.Byte();
  op->o.window = w < 128 ? 0 : w < 210 ? 1 + w % 6 : kWindows[w % 8];
  static const float kCaps[] = {50.0f, 0.5f, 2.0f, 1e-30f, -1.0f, NAN, INFINITY, -INFINITY,
                                1e30f, -0.0f, 1e-45f, -50.0f};
  const uint8_t c = in.Byte();
  op->o.softcap = c < 140 ? 0.0f : kCaps[c % 12];
  const size_t nh = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(heads, 1), 64));
  if (in.Byte() >= 150) {
    op->slopes.resize(nh);
    for (float& x : op->slopes) x = PerHead(in);
    op->o.alibi_slopes = op->slopes.data();
  }
  if (in.Byte() >= 150) {
    op->sinks.resize(nh);
    for (float& x : op->sinks) x = PerHead(in);
    op->o.sinks = op->sinks.data();
  }
  bool ok = op->o.window >= 0 && op->o.softcap >= 0.0f && isfinite(op->o.softcap);
  for (float x : op->slopes) ok = ok && isfinite(x);
  for (float x : op->sinks) ok = ok && isfinite(x);
  if (in.Byte() >= 140) {
    const bool all[3] = {true, true, true};
    const unsigned zero_mask = in.Byte() < 128 ? in.Byte() % 8 : 0;  // broadcasts
    MakeView(in, arena, bias_dims, all, &op->bias, zero_mask, near);
    if (in.Byte() > 250) {  // a tensor whose data is NULL
      op->bias.t.data = nullptr;
      op->bias.valid_alone = false;
    }
    op->has_bias = true;
    op->o.bias = &op->bias.t;
    ok = ok && op->bias.valid_alone;
    // -inf (sometimes +inf or NaN) at a few bias elements: keys removed.
    const uint8_t poke = in.Byte();
    if (op->bias.valid_alone && op->bias.fits && poke >= 128) {
      const int n = 1 + poke % 4;
      const int eb = ElementBytes(op->bias.dtype_int);
      for (int k = 0; k < n; ++k) {
        int64_t idx[4];
        for (int i = 0; i < 4; ++i) idx[i] = in.Byte() % bias_dims[i];
        const uint8_t kind = in.Byte();
        const bool neg_inf = kind < 224;
        if (!neg_inf) op->finite = false;
        __int128 at = op->bias.lo;
        for (int i = 0; i < 3; ++i) at += static_cast<__int128>(idx[i]) * op->bias.t.strides[i] * eb;
        at += idx[3] * eb;
        const size_t a = static_cast<size_t>(at);
        if (eb == 4) {
          const float x = neg_inf ? -INFINITY : (kind & 1) ? INFINITY : NAN;
          memcpy(&arena[a], &x, 4);
        } else {
          const uint16_t x = op->bias.dtype_int == 1 ? (neg_inf ? 0xFC00 : (kind & 1) ? 0x7C00 : 0x7E00)
                                                      : (neg_inf ? 0xFF80 : (kind & 1) ? 0x7F80 : 0x7FC0);
          memcpy(&arena[a], &x, 2);
        }
        for (int i = 0; i < eb; ++i) op->poked.push_back(at + i);
      }
    }
  }
  op->valid_alone = ok;
}

// Whether a -inf poked into the bias lies in an input the kernels read as
// q, k or v (then that input is not finite).
bool PokedInto(const Options& op, std::initializer_list<const View*> views) {
  for (__int128 at : op.poked)
    for (const View* v : views)
      if (v->space == 0 && v->lo <= at && at <= v->hi) return true;
  return false;
}

void Verbose(int fn, bool valid, bool called, const char* what) {
  if (getenv("HEADSUM_FUZZ_VERBOSE")) {
    fprintf(stderr, "fn %d valid %d called %d %s target %s\n", fn, valid, called, what,
            headsum_active_target());
  }
}

// Marks the bytes of a view's elements in `mask` (its space's) and checks
// them finite.
void MarkOutput(int fn, const View& o, const uint8_t* base, std::vector<bool>& mask,
                bool check_finite) {
  const int eb = ElementBytes(o.dtype_int);
  for (int64_t b = 0; b < o.dims[0]; ++b)
    for (int64_t h = 0; h < o.dims[1]; ++h)
      for (int64_t s = 0; s < o.dims[2]; ++s)
        for (int64_t l = 0; l < o.dims[3]; ++l) {
          const size_t at = static_cast<size_t>(o.lo) + static_cast<size_t>(
              ((o.uses[0] ? b * o.t.strides[0] : 0) + (o.uses[1] ? h * o.t.strides[1] : 0) +
               (o.uses[2] ? s * o.t.strides[2] : 0) + l) * eb);
          for (int i = 0; i < eb; ++i) mask[at + i] = true;
          if (!check_finite) continue;
          const float x = DecodeElement(base + at, o.dtype_int);
          if (eb == 4 ? !isfinite(x) : isnan(x))  // f16 may overflow to inf; NaN never
            Finding("non-finite output from finite inputs", fn, HEADSUM_OK);
        }
}

void FillArena(std::vector<uint8_t>& arena, Input& in) { FillBytes(arena, in); }

int FuzzAttentionEx(Input& in) {
  const int fn = 15;
  static std::vector<uint8_t> arena(kArenaBytes);
  FillArena(arena, in);
  int64_t kv;
  bool shape_ok;
  headsum_attn_shape s = SmallAttnShape(in, &kv, &shape_ok);
  const int64_t one[4] = {1, 1, 1, 1};
  const int64_t qd[4] = {s.batch, s.heads, s.seq_q, s.head_dim};
  const int64_t kd[4] = {s.batch, kv, s.seq_kv, s.head_dim};
  const int64_t bd[4] = {s.batch, s.heads, s.seq_q, s.seq_kv};
  const bool all[3] = {true, true, true};
  View q, k, v, o;
  MakeView(in, arena.data(), shape_ok ? qd : one, all, &q);
  MakeView(in, arena.data(), shape_ok ? kd : one, all, &k);
  MakeView(in, arena.data(), shape_ok ? kd : one, all, &v);
  MakeView(in, arena.data(), shape_ok ? qd : one, all, &o, 0, &q);
  Options op;
  MakeOptions(in, arena.data(), shape_ok ? s.heads : 1, shape_ok ? bd : one, &o, &op);
  const std::vector<uint8_t> before = arena;
  bool valid = shape_ok && q.valid_alone && k.valid_alone && v.valid_alone && o.valid_alone &&
               !OutputAliases(o) && !Meets(o, q) && !Meets(o, k) && !Meets(o, v) &&
               op.valid_alone && !(op.has_bias && Meets(o, op.bias));
  if (valid && !(q.fits && k.fits && v.fits && o.fits && (!op.has_bias || op.bias.fits))) {
    Verbose(fn, valid, false, "too large");
    return 0;
  }
  const bool null_tensor = in.Byte() > 250;
  if (null_tensor) valid = false;
  Verbose(fn, valid, true, op.null ? "options NULL" : op.has_bias ? "bias" : "options");
  const headsum_status st = headsum_attention_tensors_ex(
      &s, op.null ? nullptr : &op.o, &q.t, &k.t, &v.t, null_tensor ? nullptr : &o.t);
  if (!valid) {
    if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid attention_tensors_ex not refused", fn, st);
    if (headsum_last_error()[0] == '\0') Finding("refused without a message", fn, st);
    if (arena != before) Finding("output written on failure", fn, st);
    return 0;
  }
  if (st != HEADSUM_OK) Finding("valid attention_tensors_ex failed", fn, st);
  std::vector<bool> mask(kArenaBytes, false);
  MarkOutput(fn, o, arena.data(), mask, op.finite && !PokedInto(op, {&q, &k, &v}));
  for (size_t i = 0; i < kArenaBytes; ++i)
    if (!mask[i] && arena[i] != before[i]) Finding("wrote outside the output view", fn, st);
  return 0;
}

void Why(bool valid, const char** why, const char* rule) {
  if (!valid && *why == nullptr) *why = rule;
}

// fn 16 headsum_attention_paged, fn 17 headsum_paged_kv_write.
int FuzzPaged(int fn, Input& in) {
  const bool write = fn == 17;
  const char* why = nullptr;  // the first rule broken (HEADSUM_FUZZ_VERBOSE)
  static std::vector<uint8_t> arena(kArenaBytes);
  FillArena(arena, in);
  // The batch shape.
  headsum_batch_shape s = {};
  s.batch = SmallDim(in);
  s.heads = SmallDim(in);
  s.head_dim = SmallDim(in);
  const uint8_t kvsel = in.Byte();
  s.kv_heads = kvsel < 128 ? 0 : kvsel < 250 ? 1 + kvsel % 3 : -1;
  s.scale = in.Scale();
  s.causal = in.Byte() & 1;
  const int64_t Hkv = s.kv_heads == 0 ? s.heads : s.kv_heads;
  bool valid = s.batch >= 1 && s.heads >= 1 && s.head_dim >= 1 && s.kv_heads >= 0 &&
               Hkv >= 1 && s.heads % Hkv == 0 && isfinite(s.scale);
               Why(valid, &why, "shape");
  const int64_t B = std::max<int64_t>(s.batch, 1);  // arrays are sized for at least one
  std::vector<int64_t> q_offsets(static_cast<size_t>(B + 1), 0), kv_lens(static_cast<size_t>(B));
  static const int64_t kHostileLen[] = {-1, -5, INT64_MIN, INT64_MAX, int64_t{1} << 40,
                                        1030, 3037000500, 70};
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t r = in.Byte();
    const int64_t n = r < 150 ? r % 4 : r < 215 ? 1 : r < 250 ? 5 + r % 3 : 65 + r % 3;
    q_offsets[b + 1] = q_offsets[b] + n;
    const uint8_t e = in.Byte();
    kv_lens[b] = e < 200 ? n + e % 20 : e < 235 ? n - 1 - e % 2
                                                : Clamp64(static_cast<__int128>(n) + kHostileLen[e % 8]);
    if (e >= 248) kv_lens[b] = kHostileLen[e % 8];
  }
  const uint8_t qp = in.Byte();  // q_offsets perturbed: not from 0, decreasing, hostile
  if (qp >= 200) {
    static const int64_t kOdd[] = {INT64_MIN, INT64_MAX, -1, 1, INT64_MAX / 2, -3};
    const size_t i = in.Byte() % (B + 1);
    if (qp < 220 && i + 1 < q_offsets.size()) {
      std::swap(q_offsets[i], q_offsets[i + 1]);
    } else {
      q_offsets[i] = qp < 230 ? q_offsets[i] + (qp & 1 ? 1 : -1) : kOdd[qp % 6];
    }
  }
  s.q_offsets = in.Byte() > 252 ? nullptr : q_offsets.data();
  s.kv_lens = in.Byte() > 252 ? nullptr : kv_lens.data();
  valid = valid && s.q_offsets != nullptr && s.kv_lens != nullptr;
  Why(valid, &why, "NULL q_offsets or kv_lens");
  // q_offsets from 0 and non-decreasing, 0 <= n_b <= kv_lens[b] (in 128 bits).
  __int128 max_rows = 0, max_keys = 0;
  valid = valid && q_offsets[0] == 0;
  for (int64_t b = 0; b < B; ++b) {
    const __int128 n = static_cast<__int128>(q_offsets[b + 1]) - q_offsets[b];
    valid = valid && n >= 0 && kv_lens[b] >= 0 && n <= kv_lens[b];
    max_rows = std::max(max_rows, n);
    max_keys = std::max<__int128>(max_keys, kv_lens[b]);
  }
  Why(valid, &why, "q_offsets or kv_lens");
  const int64_t T = q_offsets[B];  // when valid, the rows in all
  // The paged cache.
  headsum_paged_kv kv = {};
  static const int64_t kHostileBlock[] = {0, -1, INT64_MAX, INT64_MIN, int64_t{1} << 40,
                                          3037000500, int64_t{1} << 62, 7};
  static const int64_t kBlockSizes[] = {1, 2, 3, 4, 5, 8, 16, 64};
  const uint8_t bsel = in.Byte();
  kv.block_size = bsel < 220 ? kBlockSizes[bsel % 8] : kHostileBlock[bsel % 8];
  const int64_t bs = std::max<int64_t>(kv.block_size, 1);
  __int128 need = 0;  // blocks the longest sequence uses
  for (int64_t b = 0; b < B; ++b)
    need = std::max<__int128>(need, (std::max<int64_t>(kv_lens[b], 0) + static_cast<__int128>(bs) - 1) / bs);
  const uint8_t psel = in.Byte();
  kv.blocks_per_seq = psel < 200 ? Clamp64(std::max<__int128>(need, 1) + psel % 3)
                      : psel < 225 ? Clamp64(need - 1)
                                   : kHostileBlock[psel % 8];
  valid = valid && kv.block_size >= 1 && kv.blocks_per_seq >= 1 &&
          static_cast<__int128>(B) * kv.blocks_per_seq <= kMaxElements;
          Why(valid, &why, "block_size or blocks_per_seq");
  for (int64_t b = 0; b < B && valid; ++b)
    valid = static_cast<__int128>(kv.blocks_per_seq) * kv.block_size >= kv_lens[b];
  Why(valid, &why, "kv_lens past the blocks");
  // The block table: entries [b * blocks_per_seq, + used) the call may read
  // (the blocks used, or for a write the blocks written), the allocation
  // sometimes exactly up to the last of them.
  const int64_t bps = std::max<int64_t>(kv.blocks_per_seq, 1);
  auto first_block = [&](int64_t b) -> __int128 {  // first block read
    if (!write) return 0;
    const __int128 n = static_cast<__int128>(q_offsets[b + 1]) - q_offsets[b];
    return (kv_lens[b] - n) / bs;
  };
  auto end_block = [&](int64_t b) -> __int128 {  // past the last block read
    const __int128 n = static_cast<__int128>(q_offsets[b + 1]) - q_offsets[b];
    if (write && n <= 0) return first_block(b);  // writes nothing: reads nothing
    return std::min<__int128>((std::max<int64_t>(kv_lens[b], 0) + static_cast<__int128>(bs) - 1) / bs, bps);
  };
  __int128 table_need = 1;
  for (int64_t b = 0; b < B; ++b) {
    if (end_block(b) > first_block(b))
      table_need = std::max<__int128>(table_need, static_cast<__int128>(b) * bps + end_block(b));
  }
  const __int128 table_full = static_cast<__int128>(B) * bps;
  const bool exact_table = in.Byte() & 1;
  const __int128 table_n = exact_table || table_full > 4096 ? table_need : table_full;
  if (table_n > (1 << 16)) {
    Verbose(fn, valid, false, "table too large");
    return 0;
  }
  std::vector<int32_t> table(static_cast<size_t>(table_n));
  const uint8_t tmode = in.Byte();
  // Blocks handed out in order (tmode < 128) from a pool with as many
  // blocks as entries: no two sequences share one, writes rarely meet.
  const uint8_t nsel = in.Byte();
  kv.num_blocks = nsel >= 220 ? kHostileBlock[nsel % 8]
                  : tmode < 128 ? static_cast<int64_t>(table_n) + nsel % 3 - (nsel % 16 == 0)
                                : 1 + nsel % 12;
  valid = valid && kv.num_blocks >= 1;
  Why(valid, &why, "num_blocks");
  const int64_t nb_small = std::min<int64_t>(std::max<int64_t>(kv.num_blocks, 1), INT32_MAX);
  for (size_t i = 0; i < table.size(); ++i) {
    const uint8_t e = in.Byte();
    if (tmode < 128 && e < 240) {  // blocks handed out in order: writes rarely meet
      table[i] = static_cast<int32_t>(i % nb_small);
    } else if (e < 220) {
      table[i] = static_cast<int32_t>(e % nb_small);
    } else {
      static const int64_t kOdd[] = {-1, INT32_MAX, INT32_MIN, 0, -7};
      const int64_t x = e % 6 == 5 ? kv.num_blocks : kOdd[e % 6];
      table[i] = static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(x, INT32_MIN), INT32_MAX));
    }
  }
  kv.block_table = in.Byte() > 252 ? nullptr : table.data();
  valid = valid && kv.block_table != nullptr;
  Why(valid, &why, "NULL block_table");
  for (int64_t b = 0; b < B && valid; ++b)
    for (__int128 n = first_block(b); n < end_block(b) && valid; ++n) {
      const int32_t e = table[static_cast<size_t>(b * bps + n)];
      valid = e >= 0 && e < kv.num_blocks;
    }
    Why(valid, &why, "a block_table entry");
  // The pools: [num_blocks][Hkv][block_size][L] views (strides block, kv
  // head, slot), in the arena or in separate buffers; V beside K, on it,
  // a few bytes off, anywhere.
  const int64_t L = std::max<int64_t>(s.head_dim, 1);
  const int64_t pd[4] = {std::max<int64_t>(kv.num_blocks, 1), std::max<int64_t>(Hkv, 1), bs, L};
  const bool all[3] = {true, true, true};
  View kp, vp;
  MakeView(in, arena.data(), pd, all, &kp);
  vp = kp;
  const uint8_t vmode = in.Byte();
  Space kbuf, vbuf;
  const size_t eb_pool = static_cast<size_t>(ElementBytes(kp.dtype_int));
  const __int128 pool_span = kp.hi - kp.lo + 1;
  const bool separate = vmode >= 100 && kp.t.data != nullptr && kp.valid_alone &&
                        pool_span <= (1 << 20);
  if (separate) {  // exact-size buffers (one or two), K and V at small offsets
    const size_t k_off = (in.Byte() % 3) * eb_pool + (in.Byte() > 250 ? 1 : 0);
    size_t v_off = (in.Byte() % 3) * eb_pool;
    const bool one_buffer = vmode >= 190;
    if (one_buffer) {  // V after K, or interleaved a slot's worth of K's heads further
      const __int128 head_part = std::min<__int128>(
          static_cast<__int128>(std::max<int64_t>(kp.t.strides[1], 0)) * eb_pool, pool_span);
      v_off += k_off + static_cast<size_t>(in.Byte() % 2 ? pool_span : head_part);
    }
    kbuf.bytes.resize(static_cast<size_t>(std::max(k_off, one_buffer ? v_off : 0) + pool_span));
    FillBytes(kbuf.bytes, in);
    kp.t.data = kbuf.bytes.data() + k_off;
    Measure(&kp, kbuf.bytes.data(), kbuf.bytes.size(), 1);
    if (one_buffer) {
      vp.t.data = kbuf.bytes.data() + v_off;
      Measure(&vp, kbuf.bytes.data(), kbuf.bytes.size(), 1);
    } else {
      vbuf.bytes.resize(static_cast<size_t>(v_off + pool_span));
      FillBytes(vbuf.bytes, in);
      vp.t.data = vbuf.bytes.data() + v_off;
      Measure(&vp, vbuf.bytes.data(), vbuf.bytes.size(), 2);
    }
  } else if (vmode < 40) {  // V on K
  } else if (vmode < 100 && kp.t.data != nullptr) {  // V a few elements or a block part off K
    const int64_t delta = in.Byte() & 1 ? static_cast<int64_t>(in.Byte() % 9) - 4
                                        : Clamp64(static_cast<__int128>(bs) * std::max<int64_t>(kp.t.strides[1], 0));
    const __int128 at = kp.lo + static_cast<__int128>(delta) * static_cast<int64_t>(eb_pool);
    vp.t.data = arena.data() + static_cast<size_t>(std::min<__int128>(std::max<__int128>(at, 0), kArenaBytes - 1));
    Measure(&vp, arena.data(), kArenaBytes, 0);
  } else {
    const uint32_t off = (static_cast<uint32_t>(in.Byte()) << 8 | in.Byte()) % kArenaBytes;
    vp.t.data = arena.data() + off;
    Measure(&vp, arena.data(), kArenaBytes, 0);
  }
  if (in.Byte() > 250) vp.t.data = nullptr, vp.valid_alone = false;
  kv.k = kp.t.data;
  kv.v = vp.t.data;
  memcpy(&kv.dtype, &kp.dtype_int, sizeof(int));
  kv.strides[0] = kp.t.strides[0];
  kv.strides[1] = kp.t.strides[2];  // slot
  kv.strides[2] = kp.t.strides[1];  // kv head
  valid = valid && kp.valid_alone && vp.valid_alone;
  Why(valid, &why, "a pool view");
  const bool kv_null = in.Byte() > 252;
  if (kv_null) valid = false;
  Why(valid, &why, "NULL kv");
  // q and out (attention) or k_new and v_new (write): token rows [T][n][L].
  const bool rows_uses[3] = {false, true, true};
  const int64_t row_heads = write ? std::max<int64_t>(Hkv, 1) : std::max<int64_t>(s.heads, 1);
  const int64_t rd[4] = {1, row_heads, std::max<int64_t>(T, 1), L};
  View a, c;  // q, out or k_new, v_new
  MakeView(in, arena.data(), rd, rows_uses, &a, 0, kp.space == 0 ? &kp : nullptr);
  MakeView(in, arena.data(), rd, rows_uses, &c, 0, in.Byte() & 1 ? &a : kp.space == 0 ? &kp : &a);
  const bool null_tensor = in.Byte() > 250;
  const bool rows = valid && T > 0;  // T = 0: q and out (k_new, v_new) are not looked at
  Options op;
  if (!write) {
    const int64_t bias_dims[4] = {B, std::max<int64_t>(s.heads, 1),
                                  Clamp64(std::max<__int128>(max_rows, 1)),
                                  Clamp64(std::max<__int128>(max_keys, 1))};
    MakeOptions(in, arena.data(), s.heads, bias_dims, &c, &op);
    valid = valid && op.valid_alone;
    Why(valid, &why, "options");
  }
  if (rows) {
    if (null_tensor) valid = false;
    valid = valid && a.valid_alone && c.valid_alone;
    Why(valid, &why, "a NULL or bad token-row view");
    if (write) {
      for (const View* pool : {&kp, &vp})
        valid = valid && !Meets(*pool, a) && !Meets(*pool, c);
      Why(valid, &why, "a pool meets k_new or v_new");
    } else {
      valid = valid && !OutputAliases(c) && !Meets(c, a) && !Meets(c, kp) && !Meets(c, vp) &&
              !(op.has_bias && Meets(c, op.bias));
              Why(valid, &why, "out aliases or meets an input");
    }
  }
  // A write's destinations: the elements of each new row's slot (K and V),
  // none meeting another.
  struct Dest { uint8_t* to; const uint8_t* from; int from_dtype; };
  std::vector<Dest> dests;
  if (write && valid && rows && a.fits && c.fits && kp.fits && vp.fits) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = q_offsets[b + 1] - q_offsets[b];
      for (int64_t r = 0; r < n; ++r) {
        const int64_t pos = kv_lens[b] - n + r, t = q_offsets[b] + r;
        const int64_t blk = table[static_cast<size_t>(b * bps + pos / bs)];
        for (int64_t g = 0; g < Hkv; ++g)
          for (int64_t l = 0; l < L; ++l)
            for (int i = 0; i < 2; ++i) {
              const View& pool = i == 0 ? kp : vp;
              const View& src = i == 0 ? a : c;
              uint8_t* to = static_cast<uint8_t*>(pool.t.data) +
                            (blk * pool.t.strides[0] + (pos % bs) * kv.strides[1] +
                             g * kv.strides[2] + l) * static_cast<int64_t>(eb_pool);
              const uint8_t* from = static_cast<const uint8_t*>(src.t.data) +
                                    (t * src.t.strides[2] + g * src.t.strides[1] + l) *
                                        ElementBytes(src.dtype_int);
              dests.push_back({to, from, src.dtype_int});
            }
      }
    }
    std::vector<uintptr_t> at;
    for (const Dest& d : dests) at.push_back(reinterpret_cast<uintptr_t>(d.to));
    std::sort(at.begin(), at.end());
    for (size_t i = 1; i < at.size() && valid; ++i) valid = at[i] - at[i - 1] >= eb_pool;
    Why(valid, &why, "destinations meet");
  }
  // Calls too large for the arena, or that would attend over too many keys.
  __int128 work = 0;
  for (int64_t b = 0; b < B; ++b) work += std::max<int64_t>(kv_lens[b], 0);
  const bool fits = kp.fits && vp.fits && (!rows || (a.fits && c.fits)) &&
                    (!op.has_bias || op.bias.fits);
  if (valid && (!fits || (!write && work > 4096))) {
    Verbose(fn, valid, false, "too large");
    return 0;
  }
  const std::vector<uint8_t> before = arena;
  kbuf.before = kbuf.bytes;
  vbuf.before = vbuf.bytes;
  char what[160];
  snprintf(what, sizeof(what), "B %lld T %lld block %lld pools %s bias %d (%s)",
           (long long)s.batch, (long long)T, (long long)kv.block_size,
           separate ? "separate" : "arena", op.has_bias, why ? why : "valid");
  Verbose(fn, valid, true, what);
  if (getenv("HEADSUM_FUZZ_VERBOSE")) {
    fprintf(stderr, "  H %lld Hkv %lld L %lld dtype %d nb %lld bps %lld strides {%lld %lld %lld} k %p v %p\n  q_offsets/kv_lens/table:",
            (long long)s.heads, (long long)s.kv_heads, (long long)s.head_dim, kp.dtype_int,
            (long long)kv.num_blocks, (long long)kv.blocks_per_seq, (long long)kv.strides[0],
            (long long)kv.strides[1], (long long)kv.strides[2], kv.k, kv.v);
    for (int64_t b = 0; b < B; ++b) fprintf(stderr, " %lld/%lld", (long long)q_offsets[b + 1], (long long)kv_lens[b]);
    for (int32_t e : table) fprintf(stderr, " %d", e);
    fprintf(stderr, "\n");
  }
  const headsum_tensor* ta = null_tensor ? nullptr : &a.t;
  const headsum_status st =
      write ? headsum_paged_kv_write(&s, kv_null ? nullptr : &kv, ta, &c.t)
            : headsum_attention_paged(&s, op.null ? nullptr : &op.o, ta, kv_null ? nullptr : &kv,
                                      &c.t);
  const bool untouched = arena == before && kbuf.bytes == kbuf.before && vbuf.bytes == vbuf.before;
  if (!valid) {
    if (st != HEADSUM_ERR_INVALID_ARGUMENT) Finding("invalid paged call not refused", fn, st);
    if (headsum_last_error()[0] == '\0') Finding("refused without a message", fn, st);
    if (!untouched) Finding("output written on failure", fn, st);
    return 0;
  }
  if (st != HEADSUM_OK) Finding("valid paged call failed", fn, st);
  if (write) {  // exactly the destinations changed, to the converted new rows
    std::vector<uint8_t> want = before;
    Space kwant = kbuf, vwant = vbuf;
    kwant.bytes = kbuf.before;
    vwant.bytes = vbuf.before;
    for (const Dest& d : dests) {
      uint8_t* to = d.to;  // into the copies of the memory as it was
      auto rebase = [&](std::vector<uint8_t>& now, std::vector<uint8_t>& copy) {
        if (!now.empty() && to >= now.data() && to < now.data() + now.size())
          to = copy.data() + (d.to - now.data());
      };
      rebase(arena, want);
      rebase(kbuf.bytes, kwant.bytes);
      rebase(vbuf.bytes, vwant.bytes);
      EncodeElement(DecodeElement(d.from, d.from_dtype), kp.dtype_int, to);
    }
    if (arena != want || kbuf.bytes != kwant.bytes || vbuf.bytes != vwant.bytes)
      Finding("paged write changed other bytes or wrote other values", fn, st);
    return 0;
  }
  if (T == 0) {
    if (!untouched) Finding("a call with no query rows wrote", fn, st);
    return 0;
  }
  if (kbuf.bytes != kbuf.before || vbuf.bytes != vbuf.before) Finding("wrote into a pool", fn, st);
  std::vector<bool> mask(kArenaBytes, false);
  MarkOutput(fn, c, arena.data(), mask, op.finite && !PokedInto(op, {&a, &kp, &vp}));
  for (size_t i = 0; i < kArenaBytes; ++i)
    if (!mask[i] && arena[i] != before[i]) Finding("wrote outside the output view", fn, st);
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int fn = in.Byte() % 18;
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

  if (fn == 15) return FuzzAttentionEx(in);
  if (fn >= 16) return FuzzPaged(fn, in);
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
