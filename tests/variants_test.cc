// headsum_attention_tensors_ex: what current models add to the scores
// (sliding windows, softcap, ALiBi, sinks, additive biases and key-padding
// masks), on every compiled target, every dtype combination of the tensor
// tests and every path of the table that runs them, against the double
// reference extended with every option (tests/reference.cc) and the bounds
// of tests/error_bounds.cc extended alike (the softcap, ALiBi, bias and sink
// terms are derived there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../dispatch/attention_paths.h"  // the table of attention paths
#include "../dispatch/test_hooks.h"
#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "tensor_util.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum::dispatch::AttnPathId;

constexpr float kInf = std::numeric_limits<float>::infinity();

// How the bias is laid out: a key-padding mask [B][1][1][Skv] (strides
// {Skv, 0, 0}), a per-head term [1][H][Sq][Skv] (strides {0, Sq*Skv', Skv'}),
// or a full [B][H][Sq][Skv] one with padded rows.
enum class BiasKind { kNone, kKeyPadding, kPerHead, kFull };

struct VariantCase {
  const char* name;
  AttnCase c;
  int64_t window;
  float softcap;
  bool slopes, sinks;
  BiasKind bias;
};

const VariantCase kVariantCases[] = {
    {"window causal", {1, 4, 2, 65, 200, 16, true}, 50, 0, false, false, BiasKind::kNone},
    {"window not causal", {2, 2, 2, 17, 63, 17, false}, 9, 0, false, false, BiasKind::kNone},
    {"softcap (the seed)", {1, 8, 8, 20, 20, 64, false}, 0, 2.0f, false, false, BiasKind::kNone},
    {"softcap with bias", {2, 3, 3, 17, 33, 3, true}, 0, 3.0f, false, false, BiasKind::kFull},
    {"sinks, rows that see no key", {1, 2, 2, 5, 3, 16, true}, 0, 0, false, true,
     BiasKind::kNone},
    {"alibi, GQA, Sq < Skv", {1, 4, 2, 3, 65, 17, true}, 0, 0, true, false, BiasKind::kNone},
    {"key padding with -inf", {2, 4, 2, 20, 40, 32, false}, 0, 0, false, false,
     BiasKind::kKeyPadding},
    {"per-head bias with -inf", {2, 2, 1, 9, 30, 8, true}, 0, 0, false, false,
     BiasKind::kPerHead},
    {"GQA decode, key splits, all", {1, 8, 2, 1, 1100, 64, false}, 700, 4.0f, true, true,
     BiasKind::kKeyPadding},
    {"MHA decode, sinks", {1, 4, 4, 1, 1030, 64, false}, 0, 0, false, true, BiasKind::kNone},
    {"grouped decode, window", {1, 4, 1, 1, 531, 128, false}, 100, 0, false, false,
     BiasKind::kNone},
    {"prefill, all", {1, 4, 4, 70, 150, 32, true}, 40, 4.0f, true, true, BiasKind::kFull},
    {"the seed, window alibi sinks", {1, 8, 8, 20, 20, 64, true}, 8, 0, true, true,
     BiasKind::kNone},
    {"decode rows, window bias", {1, 2, 2, 3, 300, 64, true}, 120, 0, false, false,
     BiasKind::kPerHead},
};

// The bias's storage (of dtype t, in its kind's layout) and its values as
// the kernel reads them, expanded to [B][H][Sq][Skv] for the reference.
struct BiasBuffers {
  Strided view;
  std::vector<float> expanded;
};

BiasBuffers MakeBias(const AttnCase& c, BiasKind kind, headsum_dtype t, uint64_t seed) {
  BiasBuffers out;
  const int64_t B = c.b, H = c.h, Sq = c.sq, Skv = c.skv;
  const int64_t dims[4] = {B, H, Sq, Skv};
  int64_t st[3];
  size_t elements;
  if (kind == BiasKind::kKeyPadding) {
    st[0] = Skv, st[1] = 0, st[2] = 0;
    elements = size_t(B * Skv);
  } else if (kind == BiasKind::kPerHead) {
    const int64_t ld = Skv + 5;
    st[0] = 0, st[1] = Sq * ld, st[2] = ld;
    elements = size_t(H * Sq * ld);
  } else {
    const int64_t ld = Skv + 3;
    st[0] = H * Sq * ld, st[1] = Sq * ld, st[2] = ld;
    elements = size_t(B * H * Sq * ld);
  }
  out.view = MakeView(t, dims, st, elements, 0xFF);
  const std::vector<float> r = RandomUniform(size_t(B * H * Sq * Skv), -2.0f, 2.0f, seed);
  // Write every element the view reaches (broadcast ones more than once,
  // the last write standing); -inf on some keys: a padding mask's tail for
  // the last batch row, every seventh key of head 1.
  size_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Skv; ++j) {
          double value = r[n++];
          if (kind == BiasKind::kKeyPadding && b == B - 1 && j >= Skv - Skv / 4) value = -kInf;
          if (kind == BiasKind::kPerHead && h == 1 && j % 7 == 3) value = -kInf;
          EncodeElement(value, out.view.at(b, h, i, j), t);
        }
  out.expanded.resize(size_t(B * H * Sq * Skv));
  n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Skv; ++j) {
          out.expanded[n++] = static_cast<float>(DecodeElement(out.view.at(b, h, i, j), t));
        }
  return out;
}

std::vector<float> Slopes(int64_t heads) {  // BLOOM's: 2^(-8 (h + 1) / H), scaled up
  std::vector<float> s(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) s[size_t(h)] = 4.0f * std::exp2(-8.0f * (h + 1) / heads);
  return s;
}

// Whether path `id` adds a model's extras to its scores (the others do
// not run such calls: dispatch/attention_paths.cc).
bool TakesScoreExtras(AttnPathId id) {
  return id == AttnPathId::kTiles || id == AttnPathId::kRowsByKeys || id == AttnPathId::kRowDot;
}

class AttentionVariants : public TargetTest {};

TEST_P(AttentionVariants, EveryOptionOnEveryPathMatchesReference) {
  uint64_t seed = 500;
  const bool small = headsum_shapes::SmallSweepRequested();
  size_t case_index = 0;
  for (const VariantCase& vc : kVariantCases) {
    const AttnCase& c = vc.c;
    ++case_index;
    headsum_attn_shape shape = ShapeOf(c);
    const std::vector<float> q0 = RandomUniform(QueryElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> k0 = RandomUniform(KvElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> v0 = RandomUniform(KvElements(c), -1.0f, 1.0f, ++seed);
    const std::vector<float> slopes = Slopes(c.h);
    const std::vector<float> sinks = RandomUniform(size_t(c.h), -1.0f, 3.0f, ++seed);
    size_t combo_index = 0;
    for (const DtypeCombo& t : kCombos) {
      // Under the small sweep (qemu, sanitizers) every third combination.
      if (small && (combo_index + case_index) % 3 != 0) {
        ++combo_index;
        continue;
      }
      ++combo_index;
      const headsum_dtype bias_dtype =
          combo_index % 3 == 0 ? HEADSUM_F32 : (combo_index % 3 == 1 ? HEADSUM_BF16 : HEADSUM_F16);
      const std::vector<float> q = RoundedTo(q0, t.q), k = RoundedTo(k0, t.kv),
                               v = RoundedTo(v0, t.v);
      BiasBuffers bias;
      headsum_tensor bias_tensor;
      if (vc.bias != BiasKind::kNone) {
        bias = MakeBias(c, vc.bias, bias_dtype, ++seed);
        bias_tensor = bias.view.tensor();
      }
      headsum_attn_options opt = {};
      opt.window = vc.window;
      opt.softcap = vc.softcap;
      opt.alibi_slopes = vc.slopes ? slopes.data() : nullptr;
      opt.sinks = vc.sinks ? sinks.data() : nullptr;
      opt.bias = vc.bias != BiasKind::kNone ? &bias_tensor : nullptr;

      RefAttnDims d(shape);
      d.window = vc.window;
      d.softcap = vc.softcap;
      d.slopes = opt.alibi_slopes;
      d.sinks = opt.sinks;
      d.bias = vc.bias != BiasKind::kNone ? &bias.expanded : nullptr;
      const std::vector<double> ref = RefAttention(d, q.data(), k.data(), v.data());
      // (With a native bf16 path in force, bf16 inputs run on it: P's
      // rounding to bf16 joins the bound.)
      const std::vector<double> bound = TensorAttentionBound(d, q, k, v, ref, t);
      const bool scores = vc.softcap > 0 || vc.slopes || vc.bias != BiasKind::kNone;
      for (AttnLayout layout : {AttnLayout::kContiguous, AttnLayout::kTokenMajor}) {
        if (small && layout != AttnLayout::kContiguous) continue;
        AttnBuffers bufs = MakeAttnBuffers(c, t, layout, q, k, v);
        const std::vector<char> out_before = bufs.out.bytes;
        headsum_tensor tq = bufs.q.tensor(), tk = bufs.k.tensor(), tv = bufs.v.tensor(),
                       to = bufs.out.tensor();
        const std::string what = std::string(vc.name) + " " + LayoutName(layout) + " q " +
                                 DtypeName(t.q) + " k " + DtypeName(t.kv) + " v " +
                                 DtypeName(t.v) + " out " + DtypeName(t.out) + " bias " +
                                 DtypeName(bias_dtype);
        // The pick, then every path forced (a path that cannot run a block
        // leaves it to the pick).
        for (int p = -1; p < int(headsum::dispatch::kAttnPathCount); ++p) {
          const char* path_name = p < 0 ? "picked" : headsum::dispatch::AttnPaths()[p].name;
          if (small && p >= 0 && (p + int(case_index)) % 2 != 0) continue;
          SCOPED_TRACE(what + " path " + path_name);
          headsum::testing::ForceAttentionPath(p);
          headsum::testing::CountAttentionPathRows(true);
          bufs.out.bytes = out_before;
          const headsum_status st = headsum_attention_tensors_ex(&shape, &opt, &tq, &tk, &tv, &to);
          headsum::testing::ForceAttentionPath(-1);
          ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
          for (size_t id = 0; id < headsum::dispatch::kAttnPathCount && scores; ++id) {
            if (!TakesScoreExtras(AttnPathId(id))) {
              EXPECT_EQ(headsum::testing::AttentionPathRows(int(id)), 0u)
                  << headsum::dispatch::AttnPaths()[id].name << " ran rows with score extras";
            }
          }
          headsum::testing::CountAttentionPathRows(false);
          ASSERT_TRUE(AllWithinBound(ref, bound, bufs.out.Read(),
                                     Layout{{c.b, c.h, c.sq, c.l}, "bhil"}));
        }
      }
    }
  }
}

// A zeroed options struct (and NULL) is the plain call, bit for bit; a
// window as wide as the keys is no window.
TEST_P(AttentionVariants, NoOptionsIsThePlainCall) {
  for (const AttnCase& c : {AttnCase{1, 8, 8, 20, 20, 64, true}, AttnCase{1, 4, 2, 1, 700, 32, false},
                            AttnCase{2, 3, 3, 70, 90, 17, true}}) {
    headsum_attn_shape shape = ShapeOf(c);
    const std::vector<float> q = RandomUniform(QueryElements(c), -1.5f, 1.5f, 7);
    const std::vector<float> k = RandomUniform(KvElements(c), -1.5f, 1.5f, 8);
    const std::vector<float> v = RandomUniform(KvElements(c), -1.0f, 1.0f, 9);
    std::vector<float> plain(QueryElements(c)), zeroed(plain.size()), none(plain.size()),
        wide(plain.size());
    ASSERT_EQ(headsum_attention(&shape, q.data(), k.data(), v.data(), plain.data()), HEADSUM_OK);
    const headsum_tensor tq = headsum_bhsd(const_cast<float*>(q.data()), HEADSUM_F32, c.h, c.sq, c.l);
    const headsum_tensor tk = headsum_bhsd(const_cast<float*>(k.data()), HEADSUM_F32, c.hkv, c.skv, c.l);
    const headsum_tensor tv = headsum_bhsd(const_cast<float*>(v.data()), HEADSUM_F32, c.hkv, c.skv, c.l);
    headsum_attn_options opt = {};
    for (std::vector<float>* o : {&zeroed, &none, &wide}) {
      const headsum_tensor to = headsum_bhsd(o->data(), HEADSUM_F32, c.h, c.sq, c.l);
      opt.window = o == &wide ? c.skv + c.sq : 0;
      ASSERT_EQ(headsum_attention_tensors_ex(&shape, o == &none ? nullptr : &opt, &tq, &tk, &tv, &to),
                HEADSUM_OK)
          << headsum_last_error();
    }
    const Layout layout{{c.b, c.h, c.sq, c.l}, "bhil"};
    EXPECT_TRUE(BitwiseEqual(plain, zeroed, layout));
    EXPECT_TRUE(BitwiseEqual(plain, none, layout));
    if (c.causal) {
      EXPECT_TRUE(BitwiseEqual(plain, wide, layout));
    }
  }
}

// The same bits whatever the thread count.
TEST_P(AttentionVariants, DeterministicAcrossThreadCounts) {
  const AttnCase c{1, 4, 2, 130, 300, 32, true};
  headsum_attn_shape shape = ShapeOf(c);
  const std::vector<float> q = RandomUniform(QueryElements(c), -1.5f, 1.5f, 17);
  const std::vector<float> k = RandomUniform(KvElements(c), -1.5f, 1.5f, 18);
  const std::vector<float> v = RandomUniform(KvElements(c), -1.0f, 1.0f, 19);
  const std::vector<float> slopes = Slopes(c.h), sinks = RandomUniform(4, -1.0f, 2.0f, 20);
  BiasBuffers bias = MakeBias(c, BiasKind::kKeyPadding, HEADSUM_BF16, 21);
  headsum_tensor bt = bias.view.tensor();
  headsum_attn_options opt = {};
  opt.window = 64;
  opt.softcap = 5.0f;
  opt.alibi_slopes = slopes.data();
  opt.sinks = sinks.data();
  opt.bias = &bt;
  const headsum_tensor tq = headsum_bhsd(const_cast<float*>(q.data()), HEADSUM_F32, c.h, c.sq, c.l);
  const headsum_tensor tk = headsum_bhsd(const_cast<float*>(k.data()), HEADSUM_F32, c.hkv, c.skv, c.l);
  const headsum_tensor tv = headsum_bhsd(const_cast<float*>(v.data()), HEADSUM_F32, c.hkv, c.skv, c.l);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 8}) {
    ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
    std::vector<float> o(QueryElements(c));
    const headsum_tensor to = headsum_bhsd(o.data(), HEADSUM_F32, c.h, c.sq, c.l);
    ASSERT_EQ(headsum_attention_tensors_ex(&shape, &opt, &tq, &tk, &tv, &to), HEADSUM_OK);
    if (first.empty()) {
      first = o;
    } else {
      EXPECT_TRUE(BitwiseEqual(first, o, Layout{{c.b, c.h, c.sq, c.l}, "bhil"}))
          << threads << " threads";
    }
  }
  headsum_set_num_threads(0);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(AttentionVariants);

// Every rule of the options, each named in the message, out untouched.
TEST(AttentionVariantsInvalid, EveryRuleIsNamedAndNothingIsWritten) {
  const AttnCase c{2, 2, 2, 3, 5, 4, true};
  headsum_attn_shape shape = ShapeOf(c);
  std::vector<float> q(QueryElements(c), 0.5f), k(KvElements(c), 0.25f), v(KvElements(c), 1.0f);
  std::vector<float> out(QueryElements(c), kSentinel);
  const headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_F32, c.h, c.sq, c.l);
  const headsum_tensor tk = headsum_bhsd(k.data(), HEADSUM_F32, c.hkv, c.skv, c.l);
  const headsum_tensor tv = headsum_bhsd(v.data(), HEADSUM_F32, c.hkv, c.skv, c.l);
  const headsum_tensor to = headsum_bhsd(out.data(), HEADSUM_F32, c.h, c.sq, c.l);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float bad_slopes[2] = {0.5f, nan}, bad_sinks[2] = {kInf, 0.0f};
  std::vector<float> bias_data(size_t(c.b * c.skv), 0.0f);
  headsum_tensor bias = {bias_data.data(), HEADSUM_F32, {c.skv, 0, 0}};
  headsum_tensor bias_negative = bias;
  bias_negative.strides[0] = -1;
  headsum_tensor bias_null = bias;
  bias_null.data = nullptr;
  headsum_tensor bias_on_out = bias;
  bias_on_out.data = out.data();
  headsum_tensor bias_huge = bias;
  bias_huge.strides[1] = int64_t(1) << 61;
  struct Rule {
    const char* what;
    headsum_attn_options opt;
    const char* named;
  };
  const Rule rules[] = {
      {"window < 0", {-1, 0, nullptr, nullptr, nullptr}, "options->window = -1"},
      {"softcap < 0", {0, -1.0f, nullptr, nullptr, nullptr}, "options->softcap"},
      {"softcap inf", {0, kInf, nullptr, nullptr, nullptr}, "options->softcap"},
      {"softcap NaN", {0, nan, nullptr, nullptr, nullptr}, "options->softcap"},
      {"slope NaN", {0, 0, bad_slopes, nullptr, nullptr}, "options->alibi_slopes[1]"},
      {"sink inf", {0, 0, nullptr, bad_sinks, nullptr}, "options->sinks[0]"},
      {"bias negative stride", {0, 0, nullptr, nullptr, &bias_negative}, "options->bias"},
      {"bias NULL data", {0, 0, nullptr, nullptr, &bias_null}, "options->bias"},
      {"bias meets out", {0, 0, nullptr, nullptr, &bias_on_out}, "options->bias"},
      {"bias overflows", {0, 0, nullptr, nullptr, &bias_huge}, "options->bias"},
  };
  for (const Rule& r : rules) {
    SCOPED_TRACE(r.what);
    EXPECT_EQ(headsum_attention_tensors_ex(&shape, &r.opt, &tq, &tk, &tv, &to),
              HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find(r.named), std::string::npos)
        << headsum_last_error();
    EXPECT_NE(std::string(headsum_last_error()).find("headsum_attention_tensors_ex"),
              std::string::npos);
    for (float x : out) ASSERT_EQ(x, kSentinel);
  }
  // A valid call for contrast.
  headsum_attn_options ok = {2, 1.0f, nullptr, nullptr, &bias};
  EXPECT_EQ(headsum_attention_tensors_ex(&shape, &ok, &tq, &tk, &tv, &to), HEADSUM_OK)
      << headsum_last_error();
  EXPECT_EQ(headsum_attention_tensors_ex(nullptr, &ok, &tq, &tk, &tv, &to),
            HEADSUM_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace headsum_test
