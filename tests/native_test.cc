// The native bf16 kernels (kernels/native/), called directly, against the
// double-precision reference: every native path this build compiled and this
// CPU runs (others skip, saying why), plus the AMX kernels on the software
// model of the tiles where the CPU runs AVX512_BF16 but has no AMX.
//
// Bounds.  Inputs are bf16 values, exact in f32 and in double, and the
// reference sees exactly those values.  Products of two bf16 are exact in
// f32 and accumulate in f32, so Q K^T and O Wo carry the f32 kernels' bounds
// (error_bounds.h).  The one extra rounding of attention is P to bf16 for
// P V: each term p_j v_j gets a relative error <= u16 = 2^-8 (bf16's unit
// roundoff; the row sum l uses the f32 p_j), i.e. at most u16 sum_j p_j |v_j|
// = u16 A per output element, so
//     bound = AttentionBound + kSafety u16 A.
// A 16-bit output adds its own rounding, <= u16 |O| <= u16 A (bf16) or
// 2^-11 A (f16).  The projection's only extra is a 16-bit y's rounding.
#include <gtest/gtest.h>
#include <sys/mman.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../dispatch/native_ops.h"
#include "../kernels/native/native.h"
#include "../kernels/shapes.h"
#include "error_bounds.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum::AttnDims;
using headsum::AttnViews;
using headsum::DType;
using headsum::ProjDims;
using headsum::TensorView;
using headsum::native::Path;
using headsum_shapes::MhaShape;
using namespace headsum_shapes;  // the sweeps

constexpr double kU16 = 1.0 / 256;   // bf16 unit roundoff 2^-8
constexpr double kUF16 = 1.0 / 2048;  // f16 unit roundoff 2^-11

// ---------------------------------------------------------------------------
// Paths under test.

struct PathCase {
  std::string name;
  const Path* path;
};

std::vector<PathCase> PathCases() {
  std::vector<PathCase> cases;
  for (const Path* const* p = headsum::native::CompiledPaths(); *p != nullptr; ++p) {
    cases.push_back({(*p)->name, *p});
  }
  // The software model of the tiles checks the AMX kernels' packing and
  // tile indexing where the CPU has no AMX.  Where it has, the same kernels
  // run on the real tiles above, and the model (TDPBF16PS in scalar code) is
  // left out: under the sanitizers its projection sweep took over 300 s on
  // a 2-core Sapphire Rapids class VM at 2.0 GHz.
  const Path* amx = headsum::native::PathByName("AMX_BF16");
  const bool amx_runs = amx != nullptr && amx->cpu_runs();
  if (const Path* emu = headsum::native::AmxEmulatedPath()) {
    if (!amx_runs) cases.push_back({"AMX_BF16_EMULATED", emu});
  }
  if (cases.empty()) cases.push_back({"none_compiled", nullptr});
  return cases;
}

std::string CaseName(const testing::TestParamInfo<PathCase>& info) { return info.param.name; }

class NativeTest : public testing::TestWithParam<PathCase> {
 protected:
  void SetUp() override {
    path_ = GetParam().path;
    if (path_ == nullptr) GTEST_SKIP() << "this build compiled no native path";
    if (!path_->cpu_runs()) GTEST_SKIP() << path_->name << ": this CPU cannot run it";
  }
  const Path* path_ = nullptr;
};

// ---------------------------------------------------------------------------
// Data.

uint16_t ToBf16(float f) { return headsum::native::F32ToBf16(f); }
float FromBf16(uint16_t b) { return headsum::native::Bf16ToF32(b); }

// Uniform in [lo, hi), rounded to bf16: `bits` for the kernel, `values` (the
// same numbers as f32) for the reference.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Bf16Data RandomBf16(size_t n, float lo, float hi, uint64_t seed) {
  Bf16Data d;
  d.values = RandomUniform(n, lo, hi, seed);
  d.bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.bits[i] = ToBf16(d.values[i]);
    d.values[i] = FromBf16(d.bits[i]);
  }
  return d;
}

TensorView View(void* data, DType t, size_t sb, size_t sh, size_t ss) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.sb = sb;
  v.sh = sh;
  v.ss = ss;
  return v;
}
// Contiguous [B][H][S][L].
TensorView Bhsd(void* data, DType t, size_t H, size_t S, size_t L) {
  return View(data, t, H * S * L, S * L, L);
}

AttnDims Dims(const headsum_attn_shape& s) {
  AttnDims a;
  a.batch = size_t(s.batch);
  a.heads = size_t(s.heads);
  a.kv_heads = size_t(s.kv_heads == 0 ? s.heads : s.kv_heads);
  a.seq_q = size_t(s.seq_q);
  a.seq_kv = size_t(s.seq_kv);
  a.head_dim = size_t(s.head_dim);
  a.scale = s.scale == 0.0f ? float(1.0 / std::sqrt(double(s.head_dim))) : s.scale;
  a.causal = s.causal != 0;
  return a;
}

// A 64-byte aligned float buffer of the size a kernel asked for, followed
// by a canary: a kernel that writes past the scratch it declared fails.
struct Scratch {
  static constexpr size_t kCanary = 256;
  explicit Scratch(size_t floats)
      : n((floats + 15) / 16 * 16), p(static_cast<float*>(aligned_alloc(64, (n + kCanary) * 4))) {
    for (size_t i = 0; i < kCanary; ++i) p[n + i] = -7.25f;
  }
  ~Scratch() {
    for (size_t i = 0; i < kCanary; ++i) {
      if (p[n + i] != -7.25f) {
        ADD_FAILURE() << "a kernel wrote past its declared scratch of " << n
                      << " floats (canary float " << i << " changed)";
        break;
      }
    }
    free(p);
  }
  size_t n;
  float* p;
};

// Runs items 0..n-1 on `threads` threads, each with its own scratch.
template <class Item>
void RunItems(size_t n, size_t scratch_floats, int threads, const Item& item) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    Scratch s(scratch_floats);
    for (size_t i = next++; i < n; i = next++) item(i, s.p);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

// The work split of dispatch/attention.cc: 64-row blocks; a decode step of
// grouped heads as one head of `group` rows per kv head; keys in 512-key
// splits merged in key order when one block cannot keep threads busy.
void RunAttention(const Path& path, const AttnDims& a, const AttnViews& v, int threads) {
  if (a.seq_q == 1 && a.group() > 1) {
    AttnDims g = a;
    g.heads = a.kv_heads;
    g.seq_q = a.group();
    g.causal = false;
    AttnViews gv = v;
    gv.q = View(v.q.data, v.q.dtype, v.q.sb, v.q.sh * a.group(), v.q.sh);
    gv.out = View(v.out.data, v.out.dtype, v.out.sb, v.out.sh * a.group(), v.out.sh);
    RunAttention(path, g, gv, threads);
    return;
  }
  constexpr size_t kBlock = headsum::native::kQueryBlock, kSplit = 512;
  const size_t per_head = (a.seq_q + kBlock - 1) / kBlock;
  const size_t splits = a.seq_q <= kBlock && a.seq_kv >= 2 * kSplit ? (a.seq_kv + kSplit - 1) / kSplit : 1;
  const size_t scratch = path.attention_scratch(a);
  if (splits == 1) {
    RunItems(a.batch * a.heads * per_head, scratch, threads, [&](size_t item, float* s) {
      const size_t bh = item / per_head, blk = item % per_head;
      const size_t i0 = blk * kBlock, i1 = std::min(i0 + kBlock, a.seq_q);
      path.attention_rows(a, v, bh / a.heads, bh % a.heads, i0, i1, 0, a.seq_kv, nullptr, s);
    });
    return;
  }
  const size_t rec = a.seq_q * headsum::native::PartialFloats(a);
  std::vector<float> partials(a.batch * a.heads * splits * rec);
  RunItems(a.batch * a.heads * splits, scratch, threads, [&](size_t item, float* s) {
    const size_t bh = item / splits, c = item % splits;
    path.attention_rows(a, v, bh / a.heads, bh % a.heads, 0, a.seq_q, c * kSplit,
                        std::min((c + 1) * kSplit, a.seq_kv), partials.data() + item * rec, s);
  });
  for (size_t bh = 0; bh < a.batch * a.heads; ++bh) {
    headsum::native::MergePartials(a, partials.data() + bh * splits * rec, splits, v.out,
                                   bh / a.heads, bh % a.heads, 0, a.seq_q);
  }
}

struct AttnCase {
  Bf16Data q, k, v;
};
AttnCase MakeAttnCase(const MhaShape& s, uint64_t seed) {
  return {RandomBf16(s.q_elems(), -1, 1, 3 * seed + 1), RandomBf16(s.kv_elems(), -1, 1, 3 * seed + 2),
          RandomBf16(s.kv_elems(), -1, 1, 3 * seed + 3)};
}

// The bound of the file comment; `out_u`: unit roundoff of the output dtype
// (0 for f32).
std::vector<double> NativeAttentionBound(const RefAttnDims& d, const AttnCase& c, double out_u) {
  std::vector<double> bound = AttentionBound(d, c.q.values.data(), c.k.values.data(), c.v.values.data());
  // kSafety 2^-8 A: P's rounding, and the output's (u A) on top.
  const std::vector<double> pv =
      NativeBf16PvBound(d, c.q.values.data(), c.k.values.data(), c.v.values.data());
  for (size_t i = 0; i < bound.size(); ++i) bound[i] += pv[i] * (1.0 + out_u / kU16);
  return bound;
}

std::vector<float> Widen(const std::vector<uint16_t>& bits, DType t) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    out[i] = t == DType::kBF16 ? FromBf16(bits[i]) : headsum::native::F16ToF32(bits[i]);
  }
  return out;
}

testing::AssertionResult CheckAttention(const Path& path, const MhaShape& s, uint64_t seed,
                                        DType out_type, int threads) {
  const headsum_attn_shape shape = s.attn();
  const AttnDims a = Dims(shape);
  AttnCase c = MakeAttnCase(s, seed);
  const size_t Hkv = a.kv_heads, L = a.head_dim;
  AttnViews v;
  v.q = Bhsd(c.q.bits.data(), DType::kBF16, a.heads, a.seq_q, L);
  v.k = Bhsd(c.k.bits.data(), DType::kBF16, Hkv, a.seq_kv, L);
  v.v = Bhsd(c.v.bits.data(), DType::kBF16, Hkv, a.seq_kv, L);
  std::vector<float> out(s.out_elems(), kSentinel);
  std::vector<uint16_t> out16(s.out_elems(), 0x7FC1);
  v.out = out_type == DType::kF32 ? Bhsd(out.data(), DType::kF32, a.heads, a.seq_q, L)
                                  : Bhsd(out16.data(), out_type, a.heads, a.seq_q, L);
  RunAttention(path, a, v, threads);
  if (out_type != DType::kF32) out = Widen(out16, out_type);
  const RefAttnDims d(shape);
  const double out_u = out_type == DType::kF32 ? 0.0 : (out_type == DType::kBF16 ? kU16 : kUF16);
  return AllWithinBound(RefAttention(d, c.q.values.data(), c.k.values.data(), c.v.values.data()),
                        NativeAttentionBound(d, c, out_u), out, HeadsLayout(s));
}

// Shapes beyond the sweep: decode with key splits (MHA, GQA, MQA), long
// prefills that cross key blocks and 16-row groups, odd head dims.
std::vector<MhaShape> ExtraAttentionShapes() {
  return {
      MhaShape{1, 8, 8, 1, 4096, 64, 512, false},   // decode, 8 splits
      MhaShape{2, 8, 2, 1, 1500, 64, 512, true},    // GQA decode, ragged last split
      MhaShape{1, 4, 1, 1, 1029, 80, 96, false},    // MQA decode
      MhaShape{1, 2, 2, 5, 2100, 128, 96, true},    // few rows, splits, causal
      MhaShape{1, 2, 1, 300, 300, 64, 96, true},    // several 64-row items, causal
      MhaShape{1, 1, 1, 129, 257, 7, 17, false},    // odd L, key block tails
      MhaShape{2, 3, 3, 40, 200, 33, 17, true},     // 16-row groups + a tail group
      MhaShape{1, 2, 2, 200, 130, 96, 17, true},    // Sq > Skv: rows that see nothing
  };
}

TEST_P(NativeTest, AttentionSweepF32Out) {
  std::vector<MhaShape> shapes = SweepShapes();
  for (const MhaShape& s : ExtraAttentionShapes()) shapes.push_back(s);
  ForEachShape(shapes, [&](const MhaShape& s, uint64_t seed) {
    return CheckAttention(*path_, s, seed, DType::kF32, 2);
  });
}

TEST_P(NativeTest, AttentionSixteenBitOut) {
  std::vector<MhaShape> shapes = SmallSweepShapes();
  shapes.push_back(ExtraAttentionShapes()[1]);
  ForEachShape(shapes, [&](const MhaShape& s, uint64_t seed) {
    testing::AssertionResult r = CheckAttention(*path_, s, seed, DType::kBF16, 1);
    if (!r) return r << " (bf16 out)";
    r = CheckAttention(*path_, s, seed + 1000, DType::kF16, 1);
    if (!r) return r << " (f16 out)";
    return r;
  });
}

// The result does not depend on the thread count (1, 2, 3 threads).
// What current models add (headsum_attn_options) on the native kernels,
// through dispatch's NativeAttention (its grouped decode regroups the bias,
// its key splits cover the window and their merge takes the sinks): a
// window with and without causal, softcap, ALiBi with GQA, sinks with rows
// that see no key, a bias of each dtype with -inf entries (a key-padding
// tail and scattered keys), and all together in decode and prefill.  The
// reference takes the same options (tests/reference.cc) and the bound
// their derived terms (tests/error_bounds.cc) plus P's rounding as above.
struct NativeOptionsCase {
  const char* name;
  MhaShape s;
  int64_t window;
  float softcap;
  bool slopes, sinks;
  int bias;  // 0: none; else a full [B][H][Sq][Skv] bias: 1 f32, 2 bf16, 3 f16
};

const NativeOptionsCase kNativeOptionsCases[] = {
    {"window causal", {1, 4, 2, 65, 200, 16, 17, true}, 50, 0, false, false, 0},
    {"window not causal", {2, 2, 2, 17, 63, 17, 17, false}, 9, 0, false, false, 0},
    {"softcap, the seed", {1, 8, 8, 20, 20, 64, 512, false}, 0, 2.0f, false, false, 0},
    {"softcap with an f32 bias", {2, 3, 3, 17, 33, 3, 17, true}, 0, 3.0f, false, false, 1},
    {"sinks, rows that see no key", {1, 2, 2, 5, 3, 16, 17, true}, 0, 0, false, true, 0},
    {"alibi, GQA, Sq < Skv", {1, 4, 2, 3, 65, 17, 17, true}, 0, 0, true, false, 0},
    {"GQA decode, key splits, all", {1, 8, 2, 1, 1100, 64, 512, false}, 700, 4.0f, true, true, 2},
    {"MHA decode, splits, sinks", {1, 4, 4, 1, 1030, 64, 512, false}, 0, 0, false, true, 0},
    {"MQA decode, window", {1, 4, 1, 1, 531, 128, 512, false}, 100, 0, false, false, 0},
    {"prefill, all, f16 bias", {1, 4, 4, 70, 150, 32, 17, true}, 40, 4.0f, true, true, 3},
    {"16-row groups and a tail, window, bf16 bias", {1, 2, 2, 40, 300, 96, 17, true}, 120, 0,
     false, false, 2},
    {"window past key blocks", {1, 2, 1, 300, 600, 64, 17, true}, 130, 0, true, false, 0},
};

TEST_P(NativeTest, OptionsMatchReference) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  uint64_t seed = 900;
  for (const NativeOptionsCase& oc : kNativeOptionsCases) {
    SCOPED_TRACE(oc.name);
    const MhaShape& s = oc.s;
    const headsum_attn_shape shape = s.attn();
    AttnDims a = Dims(shape);
    const AttnCase c = MakeAttnCase(s, ++seed);
    const size_t B = a.batch, H = a.heads, Hkv = a.kv_heads, Sq = a.seq_q, Skv = a.seq_kv,
                 L = a.head_dim;
    std::vector<float> slopes(H), sinks(H);
    for (size_t h = 0; h < H; ++h) {
      slopes[h] = 4.0f * std::exp2(-8.0f * float(h + 1) / float(H));
      sinks[h] = -1.0f + 4.0f * float(h) / float(H);
    }
    // The bias: [B][H][Sq][Skv + 3] in its dtype, -inf on the last quarter
    // of the keys of batch row B - 1 and on every seventh key of head 1.
    const size_t ld = Skv + 3;
    const DType bias_t = oc.bias == 2 ? DType::kBF16 : (oc.bias == 3 ? DType::kF16 : DType::kF32);
    std::vector<float> bias32, expanded;
    std::vector<uint16_t> bias16;
    if (oc.bias != 0) {
      const std::vector<float> r = RandomUniform(B * H * Sq * ld, -2.0f, 2.0f, ++seed);
      bias32.resize(r.size());
      bias16.resize(r.size());
      expanded.resize(B * H * Sq * Skv);
      for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
          for (size_t i = 0; i < Sq; ++i)
            for (size_t j = 0; j < Skv; ++j) {
              const size_t at = ((b * H + h) * Sq + i) * ld + j;
              float x = r[at];
              if ((b == B - 1 && j >= Skv - Skv / 4) || (h == 1 && j % 7 == 3)) x = -kInf;
              bias16[at] = bias_t == DType::kBF16 ? headsum::native::F32ToBf16(x)
                                                   : headsum::native::F32ToF16(x);
              bias32[at] = bias_t == DType::kF32 ? x
                           : bias_t == DType::kBF16 ? FromBf16(bias16[at])
                                                    : headsum::native::F16ToF32(bias16[at]);
              expanded[((b * H + h) * Sq + i) * Skv + j] = bias32[at];
            }
    }
    headsum::AttnOptions o;
    o.softcap = oc.softcap;
    o.slopes = oc.slopes ? slopes.data() : nullptr;
    o.sinks = oc.sinks ? sinks.data() : nullptr;
    o.has_bias = oc.bias != 0;
    if (o.has_bias) {
      void* data = bias_t == DType::kF32 ? static_cast<void*>(bias32.data()) : bias16.data();
      o.bias = View(data, bias_t, H * Sq * ld, Sq * ld, ld);
    }
    a.window = size_t(oc.window);
    a.opt = &o;
    AttnViews v;
    v.q = Bhsd(const_cast<uint16_t*>(c.q.bits.data()), DType::kBF16, H, Sq, L);
    v.k = Bhsd(const_cast<uint16_t*>(c.k.bits.data()), DType::kBF16, Hkv, Skv, L);
    v.v = Bhsd(const_cast<uint16_t*>(c.v.bits.data()), DType::kBF16, Hkv, Skv, L);
    std::vector<float> out(s.out_elems(), kSentinel);
    v.out = Bhsd(out.data(), DType::kF32, H, Sq, L);
    ASSERT_EQ(headsum::dispatch::NativeAttention(*path_, a, v), HEADSUM_OK);

    RefAttnDims d(shape);
    d.window = oc.window;
    d.softcap = oc.softcap;
    d.slopes = o.slopes;
    d.sinks = o.sinks;
    d.bias = oc.bias != 0 ? &expanded : nullptr;
    const float* qv = c.q.values.data();
    const float* kv = c.k.values.data();
    const float* vv = c.v.values.data();
    EXPECT_TRUE(AllWithinBound(RefAttention(d, qv, kv, vv), NativeAttentionBound(d, c, 0.0), out,
                               HeadsLayout(s)));
  }
}

// Under a window, an inf in a V row that a query row's window has left
// behind (or that a -inf bias removes) does not reach that row: P V skips
// the keys the row does not see.
TEST_P(NativeTest, OptionsKeepValuesOfUnseenKeysOut) {
  const MhaShape s{1, 2, 2, 40, 100, 32, 17, true};
  const headsum_attn_shape shape = s.attn();
  AttnDims a = Dims(shape);
  AttnCase c = MakeAttnCase(s, 77);
  const size_t H = a.heads, Sq = a.seq_q, Skv = a.seq_kv, L = a.head_dim;
  // Key 5's V is +inf in every dim; rows at positions 60.. (i >= 0) with a
  // window of 20 see keys 41.. only.  Key 70's V is NaN, removed by the bias.
  for (size_t g = 0; g < H; ++g)
    for (size_t l = 0; l < L; ++l) {
      c.v.bits[(g * Skv + 5) * L + l] = ToBf16(std::numeric_limits<float>::infinity());
      c.v.bits[(g * Skv + 70) * L + l] = 0x7FC0;
      c.v.values[(g * Skv + 5) * L + l] = std::numeric_limits<float>::infinity();
      c.v.values[(g * Skv + 70) * L + l] = std::numeric_limits<float>::quiet_NaN();
    }
  std::vector<float> bias(H * Sq * Skv, 0.5f);
  for (size_t r = 0; r < H * Sq; ++r) bias[r * Skv + 70] = -std::numeric_limits<float>::infinity();
  headsum::AttnOptions o;
  o.has_bias = true;
  o.bias = View(bias.data(), DType::kF32, H * Sq * Skv, Sq * Skv, Skv);
  a.window = 20;
  a.opt = &o;
  AttnViews v;
  v.q = Bhsd(c.q.bits.data(), DType::kBF16, H, Sq, L);
  v.k = Bhsd(c.k.bits.data(), DType::kBF16, H, Skv, L);
  v.v = Bhsd(c.v.bits.data(), DType::kBF16, H, Skv, L);
  std::vector<float> out(s.out_elems(), kSentinel);
  v.out = Bhsd(out.data(), DType::kF32, H, Sq, L);
  ASSERT_EQ(headsum::dispatch::NativeAttention(*path_, a, v), HEADSUM_OK);
  RefAttnDims d(shape);
  d.window = 20;
  d.bias = &bias;
  const float* qv = c.q.values.data();
  const float* kv = c.k.values.data();
  const float* vv = c.v.values.data();
  const std::vector<double> ref = RefAttention(d, qv, kv, vv);
  for (size_t n = 0; n < ref.size(); ++n) ASSERT_TRUE(std::isfinite(ref[n])) << n;
  EXPECT_TRUE(AllWithinBound(ref, NativeAttentionBound(d, c, 0.0), out, HeadsLayout(s)));
}

TEST_P(NativeTest, AttentionBitwiseAcrossThreads) {
  std::vector<MhaShape> shapes = DeterminismShapes();
  shapes.push_back(ExtraAttentionShapes()[0]);
  shapes.push_back(ExtraAttentionShapes()[1]);
  ForEachShape(shapes, [&](const MhaShape& s, uint64_t seed) {
    const AttnDims a = Dims(s.attn());
    AttnCase c = MakeAttnCase(s, seed);
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      AttnViews v;
      v.q = Bhsd(c.q.bits.data(), DType::kBF16, a.heads, a.seq_q, a.head_dim);
      v.k = Bhsd(c.k.bits.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
      v.v = Bhsd(c.v.bits.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
      std::vector<float> out(s.out_elems(), kSentinel);
      v.out = Bhsd(out.data(), DType::kF32, a.heads, a.seq_q, a.head_dim);
      RunAttention(*path_, a, v, threads);
      if (first.empty()) {
        first = out;
      } else {
        testing::AssertionResult r = BitwiseEqual(first, out, HeadsLayout(s));
        if (!r) return r << " (" << threads << " threads vs 1)";
      }
    }
    return testing::AssertionSuccess();
  });
}

// Token-major strided views and f32 / f16 inputs: f32 inputs are rounded
// to bf16 once, so they give bitwise the result of their bf16 roundings.
TEST_P(NativeTest, AttentionViewsAndInputTypes) {
  const std::vector<MhaShape> shapes = {MhaShape{2, 4, 2, 37, 150, 64, 1, true},
                                        MhaShape{1, 8, 8, 1, 1100, 48, 1, false},
                                        MhaShape{1, 2, 1, 70, 70, 17, 1, false}};
  ForEachShape(shapes, [&](const MhaShape& s, uint64_t seed) {
    const AttnDims a = Dims(s.attn());
    const size_t H = a.heads, Hkv = a.kv_heads, Sq = a.seq_q, Skv = a.seq_kv, L = a.head_dim;
    AttnCase c = MakeAttnCase(s, seed);
    // Reference result: contiguous bf16.
    AttnViews v;
    v.q = Bhsd(c.q.bits.data(), DType::kBF16, H, Sq, L);
    v.k = Bhsd(c.k.bits.data(), DType::kBF16, Hkv, Skv, L);
    v.v = Bhsd(c.v.bits.data(), DType::kBF16, Hkv, Skv, L);
    std::vector<float> want(s.out_elems(), kSentinel);
    v.out = Bhsd(want.data(), DType::kF32, H, Sq, L);
    RunAttention(*path_, a, v, 1);

    // Token-major [B][S][H][L] bf16 K/V in a cache of capacity Skv + 5, Q f32
    // token-major, out token-major f32.
    const size_t cap = Skv + 5;
    std::vector<uint16_t> kc(a.batch * cap * Hkv * L, 0xFFFF), vc(a.batch * cap * Hkv * L, 0xFFFF);
    std::vector<float> qt(a.batch * Sq * H * L), ot(a.batch * Sq * H * L, kSentinel);
    for (size_t b = 0; b < a.batch; ++b)
      for (size_t g = 0; g < Hkv; ++g)
        for (size_t j = 0; j < Skv; ++j)
          for (size_t l = 0; l < L; ++l) {
            kc[((b * cap + j) * Hkv + g) * L + l] = c.k.bits[((b * Hkv + g) * Skv + j) * L + l];
            vc[((b * cap + j) * Hkv + g) * L + l] = c.v.bits[((b * Hkv + g) * Skv + j) * L + l];
          }
    for (size_t b = 0; b < a.batch; ++b)
      for (size_t h = 0; h < H; ++h)
        for (size_t i = 0; i < Sq; ++i)
          for (size_t l = 0; l < L; ++l) {
            // An f32 value whose bf16 rounding is the bf16 input (it lies
            // within a quarter step of it).
            const float x = c.q.values[((b * H + h) * Sq + i) * L + l];
            qt[((b * Sq + i) * H + h) * L + l] = x + std::fabs(x) * (1.0f / 1024);
          }
    AttnViews t;
    t.q = View(qt.data(), DType::kF32, Sq * H * L, L, H * L);
    t.k = View(kc.data(), DType::kBF16, cap * Hkv * L, L, Hkv * L);
    t.v = View(vc.data(), DType::kBF16, cap * Hkv * L, L, Hkv * L);
    t.out = View(ot.data(), DType::kF32, Sq * H * L, L, H * L);
    RunAttention(*path_, a, t, 2);
    std::vector<float> got(s.out_elems());
    for (size_t b = 0; b < a.batch; ++b)
      for (size_t h = 0; h < H; ++h)
        for (size_t i = 0; i < Sq; ++i)
          for (size_t l = 0; l < L; ++l)
            got[((b * H + h) * Sq + i) * L + l] = ot[((b * Sq + i) * H + h) * L + l];
    return BitwiseEqual(want, got, HeadsLayout(s));
  });
}

// NaN in V at a key some rows of a block see and others do not (causal):
// exactly the rows that see it are NaN (P = 0 times NaN must not leak).
TEST_P(NativeTest, NaNInValuesReachesOnlyTheRowsThatSeeIt) {
  for (const MhaShape& s : {MhaShape{1, 1, 1, 40, 40, 64, 1, true}, MhaShape{1, 1, 1, 5, 5, 16, 1, true},
                            MhaShape{1, 1, 1, 70, 200, 20, 1, true}}) {
    const AttnDims a = Dims(s.attn());
    AttnCase c = MakeAttnCase(s, 7);
    const size_t bad_key = a.seq_kv - a.seq_q + a.seq_q / 2;  // row Sq/2 is the first to see it
    c.v.bits[bad_key * a.head_dim + 3] = 0x7FC0;             // NaN
    AttnViews v;
    v.q = Bhsd(c.q.bits.data(), DType::kBF16, 1, a.seq_q, a.head_dim);
    v.k = Bhsd(c.k.bits.data(), DType::kBF16, 1, a.seq_kv, a.head_dim);
    v.v = Bhsd(c.v.bits.data(), DType::kBF16, 1, a.seq_kv, a.head_dim);
    std::vector<float> out(s.out_elems(), kSentinel);
    v.out = Bhsd(out.data(), DType::kF32, 1, a.seq_q, a.head_dim);
    RunAttention(*path_, a, v, 1);
    for (size_t i = 0; i < a.seq_q; ++i) {
      const bool sees = i >= a.seq_q / 2;
      EXPECT_EQ(sees, bool(std::isnan(out[i * a.head_dim + 3]))) << s.name() << " row " << i;
      if (!sees) {
        for (size_t l = 0; l < a.head_dim; ++l) ASSERT_TRUE(std::isfinite(out[i * a.head_dim + l]));
      }
    }
  }
}

// Every operand flush against a PROT_NONE page (its last element the last
// byte before it): a read or write past any view's end faults.
class GuardedBf16 {
 public:
  explicit GuardedBf16(const std::vector<uint16_t>& values) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), bytes = values.size() * 2;
    pages_ = (bytes + page - 1) / page + 1;
    map_ = static_cast<char*>(mmap(nullptr, pages_ * page, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (map_ == MAP_FAILED) std::abort();
    if (mprotect(map_ + (pages_ - 1) * page, page, PROT_NONE) != 0) std::abort();
    data_ = reinterpret_cast<uint16_t*>(map_ + (pages_ - 1) * page - bytes);
    std::memcpy(data_, values.data(), bytes);
  }
  ~GuardedBf16() { munmap(map_, pages_ * size_t(sysconf(_SC_PAGESIZE))); }
  uint16_t* data() { return data_; }

 private:
  char* map_;
  size_t pages_;
  uint16_t* data_;
};

TEST_P(NativeTest, NoAccessPastAnyView) {
  for (const MhaShape& s : {MhaShape{1, 2, 1, 1, 1100, 64, 40, false}, MhaShape{1, 2, 2, 1, 77, 7, 17, false},
                            MhaShape{1, 3, 1, 21, 37, 80, 33, true}, MhaShape{1, 1, 1, 70, 70, 96, 96, false}}) {
    SCOPED_TRACE(s.name());
    const AttnDims a = Dims(s.attn());
    AttnCase c = MakeAttnCase(s, 3);
    GuardedBf16 q(c.q.bits), k(c.k.bits), v(c.v.bits), out(std::vector<uint16_t>(s.out_elems()));
    AttnViews views;
    views.q = Bhsd(q.data(), DType::kBF16, a.heads, a.seq_q, a.head_dim);
    views.k = Bhsd(k.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
    views.v = Bhsd(v.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
    views.out = Bhsd(out.data(), DType::kBF16, a.heads, a.seq_q, a.head_dim);
    RunAttention(*path_, a, views, 1);
    // The projection of the same rows: O, Wo and y against guard pages.
    ProjDims p{size_t(s.batch), size_t(s.seq_q), size_t(s.heads), size_t(s.head_dim), size_t(s.model_dim)};
    GuardedBf16 wo(RandomBf16(s.wo_elems(), -1, 1, 9).bits), y(std::vector<uint16_t>(s.y_elems()));
    std::vector<uint16_t> packed(headsum::native::PackedWoElements(p));
    path_->pack_wo(p, View(wo.data(), DType::kBF16, 0, 0, p.model_dim), packed.data(), 0,
                   headsum::native::Panels(p));
    Scratch sc(path_->project_scratch(p));
    path_->project_rows(p, views.out, packed.data(), nullptr,
                        View(y.data(), DType::kBF16, p.seq * p.model_dim, 0, p.model_dim), 0, 0,
                        std::min(p.seq, headsum::native::kProjRows), 0, headsum::native::Panels(p),
                        sc.p);
  }
}

// ---------------------------------------------------------------------------
// Projection.

testing::AssertionResult CheckProjection(const Path& path, const MhaShape& s, uint64_t seed,
                                         bool with_bias, DType y_type, int threads) {
  const headsum_proj_shape shape = s.proj();
  ProjDims p{size_t(s.batch), size_t(s.seq_q), size_t(s.heads), size_t(s.head_dim), size_t(s.model_dim)};
  Bf16Data o = RandomBf16(s.out_elems(), -1, 1, 5 * seed + 1);
  Bf16Data wo = RandomBf16(s.wo_elems(), -1, 1, 5 * seed + 2);
  std::vector<float> bias = RandomUniform(size_t(s.model_dim), -1, 1, 5 * seed + 3);
  const float* b = with_bias ? bias.data() : nullptr;
  std::vector<uint16_t> packed(headsum::native::PackedWoElements(p), 0xFFFF);
  const TensorView wo_v = View(wo.bits.data(), DType::kBF16, 0, 0, p.model_dim);
  path.pack_wo(p, wo_v, packed.data(), 0, headsum::native::Panels(p));
  const TensorView heads = Bhsd(o.bits.data(), DType::kBF16, p.heads, p.seq, p.head_dim);
  std::vector<float> y(s.y_elems(), kSentinel);
  std::vector<uint16_t> y16(s.y_elems(), 0x7FC1);
  const TensorView yv = y_type == DType::kF32
                            ? View(y.data(), DType::kF32, p.seq * p.model_dim, 0, p.model_dim)
                            : View(y16.data(), y_type, p.seq * p.model_dim, 0, p.model_dim);
  const size_t row_blocks = (p.seq + headsum::native::kProjRows - 1) / headsum::native::kProjRows;
  // Items of 3 panels (the last one shorter): kernels that take panels in
  // pairs meet both a pair and a lone panel.
  const size_t panels = headsum::native::Panels(p), groups = (panels + 2) / 3;
  RunItems(p.batch * row_blocks * groups, path.project_scratch(p), threads, [&](size_t item, float* sc) {
    const size_t g = item % groups, rb = item / groups % row_blocks, bb = item / groups / row_blocks;
    const size_t s0 = rb * headsum::native::kProjRows;
    path.project_rows(p, heads, packed.data(), b, yv, bb, s0,
                      std::min(s0 + headsum::native::kProjRows, p.seq), 3 * g,
                      std::min(3 * g + 3, panels), sc);
  });
  if (y_type != DType::kF32) y = Widen(y16, y_type);
  const RefProjDims d(shape);
  const std::vector<double> abs_c = AbsContributions(d, o.values.data(), wo.values.data());
  std::vector<double> bound = ProjectionBound(d, abs_c, nullptr, b);
  if (y_type != DType::kF32) {
    const double u = y_type == DType::kBF16 ? kU16 : kUF16;
    for (int64_t bb = 0; bb < d.batch; ++bb)
      for (int64_t ss = 0; ss < d.seq; ++ss)
        for (int64_t c = 0; c < d.model_dim; ++c) {
          double mag = b ? std::fabs(double(b[c])) : 0.0;
          for (int64_t h = 0; h < d.heads; ++h) mag += abs_c[d.bsh(bb, ss, h) * size_t(d.model_dim) + size_t(c)];
          bound[size_t((bb * d.seq + ss) * d.model_dim + c)] += kSafety * u * mag;
        }
  }
  return AllWithinBound(RefConcatProject(d, o.values.data(), wo.values.data(), b), bound, y,
                        YLayout(s));
}

TEST_P(NativeTest, ProjectionSweep) {
  std::vector<MhaShape> shapes = ProjectionSweepShapes();
  shapes.push_back(MhaShape{1, 8, 8, 2048, 2048, 64, 512, false});
  shapes.push_back(MhaShape{2, 3, 3, 100, 100, 33, 70, false});
  ForEachShape(shapes, [&](const MhaShape& s, uint64_t seed) {
    return CheckProjection(*path_, s, seed, seed % 2 == 0, DType::kF32, 2);
  });
}

TEST_P(NativeTest, ProjectionSixteenBitOut) {
  ForEachShape(NonCausal(SmallSweepShapes()), [&](const MhaShape& s, uint64_t seed) {
    testing::AssertionResult r = CheckProjection(*path_, s, seed, true, DType::kBF16, 1);
    if (!r) return r << " (bf16 y)";
    return CheckProjection(*path_, s, seed, false, DType::kF16, 1) << " (f16 y)";
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, NativeTest, testing::ValuesIn(PathCases()), CaseName);

// ---------------------------------------------------------------------------
// Through the public API: the native paths as targets, fpmath.

headsum_tensor Tensor(void* data, headsum_dtype t, int64_t H, int64_t S, int64_t L) {
  return headsum_bhsd(data, t, H, S, L);
}

// The first native path this CPU runs, or nullptr.
// Whether CPUID's vendor string is GenuineIntel.
bool IntelCpu() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char name[13];
  memcpy(name, &b, 4);
  memcpy(name + 4, &d, 4);
  memcpy(name + 8, &c, 4);
  name[12] = '\0';
  return std::string(name) == "GenuineIntel";
#else
  return false;
#endif
}

const Path* RunnableNative() {
  for (const Path* const* p = headsum::native::CompiledPaths(); *p != nullptr; ++p) {
    if ((*p)->cpu_runs()) return *p;
  }
  return nullptr;
}

// The best native path this CPU runs whose calls take it: on Intel CPUs
// AVX512_BF16's calls run on the Highway kernels instead (VDPBF16PS at half
// the f32 FMA's rate there; dispatch/native_ops.h, NativeSlowerThanHighway).
bool CallsTake(const Path& p) { return !(std::string(p.name) == "AVX512_BF16" && IntelCpu()); }
const Path* RoutedNative() {
  for (const Path* const* p = headsum::native::CompiledPaths(); *p != nullptr; ++p) {
    if ((*p)->cpu_runs() && CallsTake(**p)) return *p;
  }
  return nullptr;
}

std::string BestHighwayTarget() {
  for (const std::string& name : CompiledTargetNames()) {
    if (headsum::native::PathByName(name.c_str()) != nullptr) continue;
    if (headsum_set_target(name.c_str()) == HEADSUM_OK) return name;
  }
  return "";
}

class NativeApi : public testing::Test {
 protected:
  void SetUp() override {
    path_ = RoutedNative();
    highway_ = BestHighwayTarget();
    ASSERT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
    if (path_ == nullptr) {
      GTEST_SKIP() << "this CPU runs no native path this build compiled that calls take"
                   << (IntelCpu() ? " (AVX512_BF16's calls run on the Highway kernels on Intel)"
                                  : "");
    }
    ASSERT_EQ(headsum_set_target(path_->name), HEADSUM_OK) << headsum_last_error();
  }
  void TearDown() override {
    EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
    EXPECT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_STRICT), HEADSUM_OK);
    EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
  }
  const Path* path_ = nullptr;
  std::string highway_;
};

TEST(NativeTargets, ListedFirstAndTheBestRunnableIsTheDefault) {
  const std::vector<std::string> names = CompiledTargetNames();
  size_t n_native = 0;
  for (const Path* const* p = headsum::native::CompiledPaths(); *p != nullptr; ++p, ++n_native) {
    ASSERT_LT(n_native, names.size());
    EXPECT_EQ(names[n_native], (*p)->name);  // native paths first, best first
  }
  ASSERT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
  const Path* best = RunnableNative();
  if (best != nullptr) {
    EXPECT_STREQ(headsum_active_target(), best->name);
  }
  for (const Path* const* p = headsum::native::CompiledPaths(); *p != nullptr; ++p) {
    const headsum_status st = headsum_set_target((*p)->name);
    if (!(*p)->cpu_runs()) {
      EXPECT_EQ(st, HEADSUM_ERR_UNSUPPORTED) << (*p)->name;
      continue;
    }
    ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
    EXPECT_STREQ(headsum_active_target(), (*p)->name);
  }
  EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
}

TEST(NativeTargets, FpmathRejectsUnknownModes) {
  EXPECT_EQ(headsum_get_fpmath(), HEADSUM_FPMATH_STRICT);
  EXPECT_EQ(headsum_set_fpmath(7), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("mode = 7"), std::string::npos);
  EXPECT_EQ(headsum_get_fpmath(), HEADSUM_FPMATH_STRICT);
  EXPECT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_BF16), HEADSUM_OK);
  EXPECT_EQ(headsum_get_fpmath(), HEADSUM_FPMATH_BF16);
  EXPECT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_STRICT), HEADSUM_OK);
}

// bf16 calls run the native kernel (bitwise its result, any thread count),
// except on AMX_BF16 with rows too few for a tile (a decode step's row or
// kv group, Sq < 8): those run the f32 kernels of the best Highway target
// (bitwise their result); a Highway target turns the native path off (f32
// arithmetic, within the f32 bound); f32 inputs take it only under fpmath
// BF16, and then give bitwise the result of their bf16 roundings.
TEST_F(NativeApi, AttentionRoutesByTargetDtypeAndFpmath) {
  for (const MhaShape& s : {MhaShape{1, 8, 8, 20, 20, 64, 512, true}, MhaShape{1, 8, 2, 1, 1300, 64, 512, false},
                            MhaShape{2, 4, 4, 130, 130, 80, 96, false}}) {
    SCOPED_TRACE(s.name());
    const headsum_attn_shape shape = s.attn();
    const AttnDims a = Dims(shape);
    AttnCase c = MakeAttnCase(s, 11);
    const int64_t H = s.heads, Hkv = s.resolved_kv_heads(), Sq = s.seq_q, Skv = s.seq_kv, L = s.head_dim;
    headsum_tensor q = Tensor(c.q.bits.data(), HEADSUM_BF16, H, Sq, L);
    headsum_tensor k = Tensor(c.k.bits.data(), HEADSUM_BF16, Hkv, Skv, L);
    headsum_tensor v = Tensor(c.v.bits.data(), HEADSUM_BF16, Hkv, Skv, L);
    // The kernel itself.
    std::vector<float> direct(s.out_elems(), kSentinel);
    AttnViews views;
    views.q = Bhsd(c.q.bits.data(), DType::kBF16, a.heads, a.seq_q, a.head_dim);
    views.k = Bhsd(c.k.bits.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
    views.v = Bhsd(c.v.bits.data(), DType::kBF16, a.kv_heads, a.seq_kv, a.head_dim);
    views.out = Bhsd(direct.data(), DType::kF32, a.heads, a.seq_q, a.head_dim);
    RunAttention(*path_, a, views, 1);
    // A Highway target: f32 arithmetic, the f32 bound.
    ASSERT_EQ(headsum_set_target(highway_.c_str()), HEADSUM_OK);
    EXPECT_EQ(headsum_active_target(), highway_);
    std::vector<float> hwy_out(s.out_elems(), kSentinel);
    headsum_tensor o = Tensor(hwy_out.data(), HEADSUM_F32, H, Sq, L);
    ASSERT_EQ(headsum_attention_tensors(&shape, &q, &k, &v, &o), HEADSUM_OK);
    const RefAttnDims d(shape);
    EXPECT_TRUE(AllWithinBound(RefAttention(d, c.q.values.data(), c.k.values.data(), c.v.values.data()),
                               AttentionBound(d, c.q.values.data(), c.k.values.data(), c.v.values.data()),
                               hwy_out, HeadsLayout(s)));
    // The same values as f32 inputs on the Highway target (the grouped
    // decode pairs bf16 K/V elements differently from f32 ones: other bits).
    std::vector<float> hwy_f32_out(s.out_elems(), kSentinel);
    ASSERT_EQ(headsum_attention(&shape, c.q.values.data(), c.k.values.data(), c.v.values.data(),
                                hwy_f32_out.data()), HEADSUM_OK);
    ASSERT_EQ(headsum_set_target(path_->name), HEADSUM_OK);
    // bf16 inputs on the native target.
    const bool few_rows_f32 = std::strcmp(path_->name, "AMX_BF16") == 0 &&
                              (Sq == 1 ? H / Hkv : Sq) < int64_t(headsum::native::kAmxMinTileRows);
    for (int threads : {1, 2}) {
      ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
      std::vector<float> got(s.out_elems(), kSentinel);
      headsum_tensor o = Tensor(got.data(), HEADSUM_F32, H, Sq, L);
      ASSERT_EQ(headsum_attention_tensors(&shape, &q, &k, &v, &o), HEADSUM_OK) << headsum_last_error();
      EXPECT_TRUE(BitwiseEqual(few_rows_f32 ? hwy_out : direct, got, HeadsLayout(s)))
          << threads << " threads" << (few_rows_f32 ? ", few rows on f32" : "");
    }
    // f32 inputs on the native target: strict keeps them on f32 (= Highway).
    std::vector<float> f32_out(s.out_elems(), kSentinel);
    ASSERT_EQ(headsum_attention(&shape, c.q.values.data(), c.k.values.data(), c.v.values.data(),
                                f32_out.data()), HEADSUM_OK);
    EXPECT_TRUE(BitwiseEqual(hwy_f32_out, f32_out, HeadsLayout(s))) << "strict";
    // fpmath BF16: the f32 inputs (already bf16 values) go native.
    ASSERT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_BF16), HEADSUM_OK);
    ASSERT_EQ(headsum_attention(&shape, c.q.values.data(), c.k.values.data(), c.v.values.data(),
                                f32_out.data()), HEADSUM_OK);
    EXPECT_TRUE(BitwiseEqual(direct, f32_out, HeadsLayout(s))) << "fpmath bf16";
    ASSERT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_STRICT), HEADSUM_OK);
  }
}

// On Intel CPUs AVX512_BF16 in force leaves every call to the Highway
// kernels (faster there: dispatch/native_ops.h): bf16 attention and
// projection, with fpmath BF16 too, give the best Highway target's bits.
TEST(NativeRouting, Avx512Bf16OnIntelRunsTheHighwayKernels) {
  const Path* path = headsum::native::PathByName("AVX512_BF16");
  if (path == nullptr || !path->cpu_runs()) GTEST_SKIP() << "AVX512_BF16 does not run here";
  if (!IntelCpu()) GTEST_SKIP() << "not an Intel CPU: AVX512_BF16's calls take it";
  const std::string highway = BestHighwayTarget();
  const MhaShape s{1, 8, 2, 70, 130, 64, 96, true};
  const headsum_attn_shape shape = s.attn();
  const headsum_proj_shape pshape = s.proj();
  AttnCase c = MakeAttnCase(s, 31);
  Bf16Data wo = RandomBf16(s.wo_elems(), -1, 1, 32);
  const int64_t H = s.heads, Hkv = s.resolved_kv_heads(), Sq = s.seq_q, Skv = s.seq_kv, L = s.head_dim;
  headsum_tensor q = Tensor(c.q.bits.data(), HEADSUM_BF16, H, Sq, L);
  headsum_tensor k = Tensor(c.k.bits.data(), HEADSUM_BF16, Hkv, Skv, L);
  headsum_tensor v = Tensor(c.v.bits.data(), HEADSUM_BF16, Hkv, Skv, L);
  headsum_tensor wo_t = {wo.bits.data(), HEADSUM_BF16, {0, 0, s.model_dim}};
  const auto run = [&](const char* target, int fpmath, std::vector<float>* att, std::vector<float>* y) {
    ASSERT_EQ(headsum_set_target(target), HEADSUM_OK) << headsum_last_error();
    ASSERT_EQ(headsum_set_fpmath(fpmath), HEADSUM_OK);
    att->assign(s.out_elems(), kSentinel);
    y->assign(s.y_elems(), kSentinel);
    headsum_tensor o = Tensor(att->data(), HEADSUM_F32, H, Sq, L);
    ASSERT_EQ(headsum_attention_tensors(&shape, &q, &k, &v, &o), HEADSUM_OK) << headsum_last_error();
    headsum_tensor heads = Tensor(c.q.bits.data(), HEADSUM_BF16, H, Sq, L);
    headsum_tensor yt = {y->data(), HEADSUM_F32, {Sq * s.model_dim, 0, s.model_dim}};
    ASSERT_EQ(headsum_project_heads_sum_tensors(&pshape, &heads, &wo_t, nullptr, &yt), HEADSUM_OK)
        << headsum_last_error();
  };
  std::vector<float> hwy_att, hwy_y, att, y;
  run(highway.c_str(), HEADSUM_FPMATH_STRICT, &hwy_att, &hwy_y);
  for (int fpmath : {HEADSUM_FPMATH_STRICT, HEADSUM_FPMATH_BF16}) {
    run("AVX512_BF16", fpmath, &att, &y);
    EXPECT_STREQ(headsum_active_target(), "AVX512_BF16");
    EXPECT_TRUE(BitwiseEqual(hwy_att, att, HeadsLayout(s))) << "attention, fpmath " << fpmath;
    EXPECT_TRUE(BitwiseEqual(hwy_y, y, YLayout(s))) << "projection, fpmath " << fpmath;
  }
  EXPECT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_STRICT), HEADSUM_OK);
  EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
}

TEST_F(NativeApi, ProjectionRoutesByTargetDtypeAndFpmath) {
  const MhaShape s{2, 8, 8, 70, 70, 64, 200, false};
  const headsum_proj_shape shape = s.proj();
  ProjDims p{size_t(s.batch), size_t(s.seq_q), size_t(s.heads), size_t(s.head_dim), size_t(s.model_dim)};
  Bf16Data o = RandomBf16(s.out_elems(), -1, 1, 21), wo = RandomBf16(s.wo_elems(), -1, 1, 22);
  const std::vector<float> bias = RandomUniform(size_t(s.model_dim), -1, 1, 23);
  // The kernel itself, one item per (row block, panel).
  std::vector<float> direct(s.y_elems(), kSentinel);
  {
    std::vector<uint16_t> packed(headsum::native::PackedWoElements(p));
    path_->pack_wo(p, View(wo.bits.data(), DType::kBF16, 0, 0, p.model_dim), packed.data(), 0,
                   headsum::native::Panels(p));
    const TensorView heads = Bhsd(o.bits.data(), DType::kBF16, p.heads, p.seq, p.head_dim);
    const TensorView yv = View(direct.data(), DType::kF32, p.seq * p.model_dim, 0, p.model_dim);
    Scratch sc(path_->project_scratch(p));
    for (size_t b = 0; b < p.batch; ++b)
      for (size_t s0 = 0; s0 < p.seq; s0 += headsum::native::kProjRows)
        path_->project_rows(p, heads, packed.data(), bias.data(), yv, b, s0,
                            std::min(s0 + headsum::native::kProjRows, p.seq), 0,
                            headsum::native::Panels(p), sc.p);
  }
  headsum_tensor heads = Tensor(o.bits.data(), HEADSUM_BF16, s.heads, s.seq_q, s.head_dim);
  headsum_tensor wo_t = {wo.bits.data(), HEADSUM_BF16, {0, 0, s.model_dim}};
  std::vector<float> got(s.y_elems(), kSentinel);
  headsum_tensor y = {got.data(), HEADSUM_F32, {s.seq_q * s.model_dim, 0, s.model_dim}};
  for (int threads : {1, 2}) {
    ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
    ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &heads, &wo_t, bias.data(), &y), HEADSUM_OK)
        << headsum_last_error();
    EXPECT_TRUE(BitwiseEqual(direct, got, YLayout(s))) << threads << " threads";
  }
  // A handle packed with the native path in force serves it, bitwise.
  headsum_wo_packed* packed = nullptr;
  ASSERT_EQ(headsum_wo_pack_tensor(&shape, &wo_t, &packed), HEADSUM_OK);
  std::fill(got.begin(), got.end(), kSentinel);
  ASSERT_EQ(headsum_project_heads_sum_packed_tensors(&shape, &heads, packed, bias.data(), &y), HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(direct, got, YLayout(s))) << "packed";
  // On a Highway target the same handle gives the f32 arithmetic.
  ASSERT_EQ(headsum_set_target(highway_.c_str()), HEADSUM_OK);
  std::vector<float> hwy_y(s.y_elems(), kSentinel);
  headsum_tensor yh = {hwy_y.data(), HEADSUM_F32, {s.seq_q * s.model_dim, 0, s.model_dim}};
  ASSERT_EQ(headsum_project_heads_sum_packed_tensors(&shape, &heads, packed, bias.data(), &yh), HEADSUM_OK);
  headsum_wo_free(packed);
  const RefProjDims d(shape);
  EXPECT_TRUE(AllWithinBound(RefConcatProject(d, o.values.data(), wo.values.data(), bias.data()),
                             ProjectionBound(d, AbsContributions(d, o.values.data(), wo.values.data()),
                                             nullptr, bias.data()),
                             hwy_y, YLayout(s)));
  // f32 inputs: strict = Highway; fpmath BF16 = the native result.
  ASSERT_EQ(headsum_set_target(path_->name), HEADSUM_OK);
  std::vector<float> f32_y(s.y_elems(), kSentinel);
  ASSERT_EQ(headsum_project_heads_sum(&shape, o.values.data(), wo.values.data(), bias.data(),
                                      f32_y.data()), HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(hwy_y, f32_y, YLayout(s))) << "strict";
  ASSERT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_BF16), HEADSUM_OK);
  ASSERT_EQ(headsum_project_heads_sum(&shape, o.values.data(), wo.values.data(), bias.data(),
                                      f32_y.data()), HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(direct, f32_y, YLayout(s))) << "fpmath bf16";
  ASSERT_EQ(headsum_set_fpmath(HEADSUM_FPMATH_STRICT), HEADSUM_OK);
}

// Conversions used by every path's 16-bit outputs: round to nearest even,
// NaN stays NaN, beyond f16's range is inf, subnormals.
TEST(NativeConversions, RoundToNearestEven) {
  EXPECT_EQ(ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(ToBf16(1.0f + 1.0f / 256), 0x3F80);         // tie -> even
  EXPECT_EQ(ToBf16(1.0f + 3.0f / 256), 0x3F82);         // tie -> even (up)
  EXPECT_EQ(ToBf16(1.0f + 1.0f / 256 + 1e-6f), 0x3F81);  // past the tie
  EXPECT_TRUE(std::isnan(FromBf16(ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  using headsum::native::F16ToF32;
  using headsum::native::F32ToF16;
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // the tie above the largest rounds to inf
  EXPECT_EQ(F32ToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(1.0f + 1.0f / 2048), 0x3C00);  // tie -> even
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
  // Every f16 value survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = uint16_t(h);
    if ((x & 0x7C00) == 0x7C00 && (x & 0x3FF) != 0) continue;  // NaN payloads may change
    ASSERT_EQ(F32ToF16(F16ToF32(x)), x) << std::hex << h;
  }
}

}  // namespace
}  // namespace headsum_test
