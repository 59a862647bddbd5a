// The C++ face of the tensor API (headsum.hpp): 16-bit element types,
// Tensor views with extents, exceptions.  Results are checked against the C
// calls on the same memory (bitwise) and the element types against
// headsum_convert (bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "headsum/headsum.hpp"
#include "test_util.h"

namespace headsum_test {
namespace {

// headsum::bf16 / f16 from float round as headsum_convert does, bit for bit.
TEST(CppTensor, ElementTypesRoundAsConvert) {
  std::vector<float> x;
  uint32_t state = 7;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t bits = state;
    if (i % 3 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;             // bf16 ties
    if (i % 3 == 1) bits = (bits & 0xC7FFE000u) | 0x00001000u | 0x38000000u;  // f16-range ties
    float f;
    memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, -3e-8f,
                  std::numeric_limits<float>::infinity()}) {
    x.push_back(f);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> c_bf(x.size()), c_h(x.size());
  const int64_t dims[4] = {1, 1, 1, n};
  headsum_tensor src = headsum_bhsd(x.data(), HEADSUM_F32, 1, 1, n);
  headsum_tensor dbf = headsum_bhsd(c_bf.data(), HEADSUM_BF16, 1, 1, n);
  headsum_tensor dh = headsum_bhsd(c_h.data(), HEADSUM_F16, 1, 1, n);
  ASSERT_EQ(headsum_convert(dims, &src, &dbf), HEADSUM_OK);
  ASSERT_EQ(headsum_convert(dims, &src, &dh), HEADSUM_OK);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(headsum::bf16(x[i]).bits, c_bf[i]) << i;
    ASSERT_EQ(headsum::f16(x[i]).bits, c_h[i]) << i;
    // Widening back is exact: headsum_convert f16 -> f32 agrees.
    float back;
    headsum_tensor s1 = headsum_bhsd(&c_h[i], HEADSUM_F16, 1, 1, 1);
    headsum_tensor d1 = headsum_bhsd(&back, HEADSUM_F32, 1, 1, 1);
    const int64_t one[4] = {1, 1, 1, 1};
    ASSERT_EQ(headsum_convert(one, &s1, &d1), HEADSUM_OK);
    headsum::f16 h;
    h.bits = c_h[i];
    const float mine = static_cast<float>(h);
    ASSERT_TRUE(std::isnan(back) ? std::isnan(mine) : memcmp(&back, &mine, 4) == 0) << i;
  }
}

TEST(CppTensor, AttentionOverABf16CacheMatchesTheCCall) {
  const int64_t B = 1, H = 4, G = 2, L = 16, cap = 50, len = 37, Sq = 1;
  std::vector<float> q = RandomUniform(size_t(B * H * Sq * L), -1, 1, 1);
  std::vector<float> kf = RandomUniform(size_t(B * G * cap * L), -1, 1, 2);
  std::vector<headsum::bf16> k(kf.size()), v(kf.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    k[i] = headsum::bf16(kf[i]);
    v[i] = headsum::bf16(-kf[i] * 0.5f);
  }
  std::vector<float> o1(q.size()), o2(q.size());
  headsum::AttnShape shape;
  shape.batch = B, shape.heads = H, shape.kv_heads = G, shape.seq_q = Sq, shape.seq_kv = len,
  shape.head_dim = L, shape.causal = true;
  auto tk = headsum::Tensor<const headsum::bf16>::bhsd(k.data(), B, G, len, L);
  auto tv = headsum::Tensor<const headsum::bf16>::bhsd(v.data(), B, G, len, L);
  tk.strides[0] = tv.strides[0] = G * cap * L;
  tk.strides[1] = tv.strides[1] = cap * L;
  headsum::attention(shape, headsum::Tensor<const float>::bhsd(q.data(), B, H, Sq, L), tk, tv,
                     headsum::Tensor<float>::bhsd(o1.data(), B, H, Sq, L));
  const headsum_attn_shape c = shape.c();
  headsum_tensor cq = headsum_bhsd(q.data(), HEADSUM_F32, H, Sq, L);
  headsum_tensor ck = headsum_bhsd(k.data(), HEADSUM_BF16, G, cap, L);
  headsum_tensor cv = headsum_bhsd(v.data(), HEADSUM_BF16, G, cap, L);
  headsum_tensor co = headsum_bhsd(o2.data(), HEADSUM_F32, H, Sq, L);
  ASSERT_EQ(headsum_attention_tensors(&c, &cq, &ck, &cv, &co), HEADSUM_OK);
  EXPECT_EQ(0, memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
}

// attention with options: a key-padding bias of extents [B][1][1][Skv]
// broadcasts (its h and i strides taken as 0), bitwise the C call with
// those strides; a bias of the wrong extents and short slopes throw.
TEST(CppTensor, AttentionWithOptionsMatchesTheCCall) {
  const int64_t B = 2, H = 4, G = 2, L = 8, Sq = 3, Skv = 11;
  const std::vector<float> q = RandomUniform(size_t(B * H * Sq * L), -1, 1, 3);
  const std::vector<float> k = RandomUniform(size_t(B * G * Skv * L), -1, 1, 4);
  const std::vector<float> v = RandomUniform(size_t(B * G * Skv * L), -1, 1, 5);
  std::vector<headsum::bf16> mask(size_t(B * Skv), headsum::bf16(0.0f));
  for (int64_t j = Skv - 3; j < Skv; ++j) {
    mask[size_t(Skv + j)] = headsum::bf16(-std::numeric_limits<float>::infinity());
  }
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks = {1.0f, 0.0f, -1.0f, 0.5f};
  headsum::AttnShape shape;
  shape.batch = B, shape.heads = H, shape.kv_heads = G, shape.seq_q = Sq, shape.seq_kv = Skv,
  shape.head_dim = L, shape.causal = true;
  headsum::AttnOptions opt;
  opt.window = 6;
  opt.softcap = 3.0f;
  opt.alibi_slopes = slopes;
  opt.sinks = sinks;
  opt.bias = headsum::AttnBias::of(
      headsum::Tensor<const headsum::bf16>::bhsd(mask.data(), B, 1, 1, Skv));
  const auto tq = headsum::Tensor<const float>::bhsd(q.data(), B, H, Sq, L);
  const auto tk = headsum::Tensor<const float>::bhsd(k.data(), B, G, Skv, L);
  const auto tv = headsum::Tensor<const float>::bhsd(v.data(), B, G, Skv, L);
  std::vector<float> o1(q.size()), o2(q.size());
  headsum::attention(shape, opt, tq, tk, tv, headsum::Tensor<float>::bhsd(o1.data(), B, H, Sq, L));
  const headsum_attn_shape c = shape.c();
  const headsum_tensor cq = tq.c(), ck = tk.c(), cv = tv.c();
  const headsum_tensor co = headsum_bhsd(o2.data(), HEADSUM_F32, H, Sq, L);
  const headsum_tensor cb = {mask.data(), HEADSUM_BF16, {Skv, 0, 0}};
  const headsum_attn_options copt = {6, 3.0f, slopes.data(), sinks.data(), &cb};
  ASSERT_EQ(headsum_attention_tensors_ex(&c, &copt, &cq, &ck, &cv, &co), HEADSUM_OK)
      << headsum_last_error();
  EXPECT_EQ(0, memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
  // Without options: the plain call.
  headsum::attention(shape, headsum::AttnOptions{}, tq, tk, tv,
                     headsum::Tensor<float>::bhsd(o1.data(), B, H, Sq, L));
  headsum::attention(shape, tq, tk, tv, headsum::Tensor<float>::bhsd(o2.data(), B, H, Sq, L));
  EXPECT_EQ(0, memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
  auto throws = [&](const char* what, const headsum::AttnOptions& bad, const char* mention) {
    SCOPED_TRACE(what);
    try {
      headsum::attention(shape, bad, tq, tk, tv, headsum::Tensor<float>::bhsd(o1.data(), B, H, Sq, L));
      ADD_FAILURE() << "no exception";
    } catch (const headsum::Error& e) {
      EXPECT_EQ(e.status(), HEADSUM_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  headsum::AttnOptions wrong = opt;
  wrong.bias = headsum::AttnBias::of(
      headsum::Tensor<const headsum::bf16>::bhsd(mask.data(), B, 1, 2, Skv));
  throws("bias [B][1][2][Skv]", wrong, "bias extent 2 is 2, the call needs 3");
  wrong.bias = headsum::AttnBias::of(
      headsum::Tensor<const headsum::bf16>::bhsd(mask.data(), B, 1, 1, 1));
  throws("bias [B][1][1][1]", wrong, "bias extent 3 is 1");
  headsum::AttnOptions short_slopes = opt;
  short_slopes.alibi_slopes = headsum::In(slopes.data(), 2);
  throws("2 slopes of 4", short_slopes, "alibi_slopes");
  headsum::AttnOptions negative = opt;
  negative.softcap = -1.0f;
  throws("softcap -1", negative, "options->softcap");
}

TEST(CppTensor, ExtentsAreCheckedAndErrorsThrow) {
  const int64_t B = 1, H = 2, S = 3, L = 4, D = 5;
  std::vector<float> o(size_t(B * H * S * L), 1.0f), y(size_t(B * S * D));
  std::vector<headsum::bf16> wo(size_t(H * L * D), headsum::bf16(0.25f));
  headsum::ProjShape p;
  p.batch = B, p.seq = S, p.heads = H, p.head_dim = L, p.model_dim = D;
  auto th = headsum::Tensor<const float>::bhsd(o.data(), B, H, S, L);
  auto tw = headsum::Tensor<const headsum::bf16>::matrix(wo.data(), H * L, D, D);
  auto ty = headsum::Tensor<float>::bhsd(y.data(), B, 1, S, D);
  headsum::project_heads_sum(p, th, tw, {}, ty);
  for (float x : y) EXPECT_EQ(x, 0.25f * float(H * L));  // exact in f32
  headsum::PackedWo packed = headsum::pack_wo(p, tw);
  std::vector<float> y2(y.size());
  headsum::project_heads_sum(p, th, packed, {}, headsum::Tensor<float>::bhsd(y2.data(), B, 1, S, D));
  EXPECT_EQ(y, y2);
  try {
    headsum::project_heads_sum(p, headsum::Tensor<const float>::bhsd(o.data(), B, H, S - 1, L),
                               tw, {}, ty);
    ADD_FAILURE() << "no exception";
  } catch (const headsum::Error& e) {
    EXPECT_EQ(e.status(), HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("heads is [1][2][2][4], the shape needs [1][2][3][4]"),
              std::string::npos) << e.what();
  }
  ty.strides[2] = 1;  // rows overlap: the C call refuses it
  EXPECT_THROW(headsum::project_heads_sum(p, th, tw, {}, ty), headsum::Error);
}

}  // namespace
}  // namespace headsum_test
