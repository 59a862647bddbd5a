// The tensor API (headsum_tensor views: f32/f16/bf16, any strides) on every
// compiled target, against the double-precision reference fed the same
// rounded values.  16-bit conversions are checked against conversions
// written here independently (in double arithmetic, ties to even, no bit
// tricks shared with kernels/convert-inl.h).
//
// Bounds.  A 16-bit input is widened exactly, so the kernel computes on the
// rounded values the reference also gets: the f32 bounds of error_bounds.h
// apply unchanged.  A 16-bit output is the f32 result rounded once to
// nearest: |out - exact| <= b32 + u16 (|exact| + b32) (+ half the f16
// subnormal spacing, 2^-25, for f16), u16 the unit roundoff (bf16: 2^-8,
// f16: 2^-11).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "../dispatch/attention_paths.h"  // the table of attention paths
#include "../dispatch/test_hooks.h"  // the K/V-in-cache threshold
#include "headsum/headsum.h"
#include "reference.h"
#include "tensor_util.h"
#include "test_util.h"

namespace headsum_test {
namespace {

class TensorAttention : public TargetTest {};

TEST_P(TensorAttention, EveryDtypeAndLayoutMatchesReference) {
  uint64_t seed = 100;
  // Under qemu (HEADSUM_TEST_SWEEP=small) every other dtype combination and
  // not the largest prefill case: about half the calls (=tiny: every fourth
  // combination, each case starting at another, so all are met).
  const bool small = headsum_shapes::SmallSweepRequested();
  const size_t every = headsum_shapes::TinySweepRequested() ? 4 : 2;
  size_t case_index = 0;
  for (const AttnCase& c : kAttnCases) {
    if (small && case_index++ == 5) continue;
    headsum_attn_shape shape = ShapeOf(c);
    const RefAttnDims d(shape);
    const std::vector<float> q0 = RandomUniform(QueryElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> k0 = RandomUniform(KvElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> v0 = RandomUniform(KvElements(c), -1.0f, 1.0f, ++seed);
    size_t combo_index = case_index;
    for (const DtypeCombo& t : kCombos) {
      if (small && combo_index++ % every != 0) continue;
      const std::vector<float> q = RoundedTo(q0, t.q), k = RoundedTo(k0, t.kv),
                               v = RoundedTo(v0, t.v);
      const std::vector<double> ref = RefAttention(d, q.data(), k.data(), v.data());
      const std::vector<double> bound = TensorAttentionBound(d, q, k, v, ref, t);
      for (AttnLayout layout : {AttnLayout::kContiguous, AttnLayout::kTokenMajor,
                                AttnLayout::kFusedQkv, AttnLayout::kCache}) {
        if (layout == AttnLayout::kFusedQkv && (c.sq != c.skv || t.q != t.kv || t.kv != t.v)) {
          continue;
        }
        SCOPED_TRACE(std::string(LayoutName(layout)) + " q " + DtypeName(t.q) + " k " +
                     DtypeName(t.kv) + " v " + DtypeName(t.v) + " out " + DtypeName(t.out) + " B" +
                     std::to_string(c.b) + " H" + std::to_string(c.h) + " Hkv" +
                     std::to_string(c.hkv) + " Sq" + std::to_string(c.sq) + " Skv" +
                     std::to_string(c.skv) + " L" + std::to_string(c.l) +
                     (c.causal ? " causal" : ""));
        AttnBuffers bufs = MakeAttnBuffers(c, t, layout, q, k, v);
        const std::vector<char> out_before = bufs.out.bytes;
        headsum_tensor tq = bufs.q.tensor(), tk = bufs.k.tensor(), tv = bufs.v.tensor(),
                       to = bufs.out.tensor();
        if (layout == AttnLayout::kFusedQkv) {
          tk.data = bufs.q.bytes.data() + bufs.k.offset;
          tv.data = bufs.q.bytes.data() + bufs.v.offset;
        }
        ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
            << headsum_last_error();
        const std::vector<float> got = bufs.out.Read();
        ASSERT_TRUE(AllWithinBound(ref, bound, got,
                                   Layout{{c.b, c.h, c.sq, c.l}, "bhil"}));
        // Nothing outside the view was written.
        size_t written = 0;
        for (size_t i = 0; i < out_before.size(); ++i) written += out_before[i] != bufs.out.bytes[i];
        EXPECT_LE(written, got.size() * Bytes(t.out));
        if (c.sq <= 3) {
          // A decode step's K/V counted as read from memory: the one-key,
          // prefetching dot path (these small K/V take the eight-key one),
          // for one query row of 16-bit K/V the 512-key tiles and the
          // streaming kernel both ways (eight keys at a time with prefetch,
          // key by key without; f32 K/V key by key too), whichever this CPU
          // would choose.
          struct RestoreThreshold {
            ~RestoreThreshold() {
              headsum::testing::SetKvInCacheBytes(headsum::testing::kKvInCacheAuto);
              headsum::testing::SetRowStream(headsum::testing::kRowStreamAuto);
            }
          } restore;
          headsum::testing::SetKvInCacheBytes(0);
          for (const int row_stream : {0, 1, 2}) {
            SCOPED_TRACE(row_stream == 0   ? "512-key tiles"
                         : row_stream == 1 ? "row stream, eight keys"
                                           : "row stream, key by key");
            headsum::testing::SetRowStream(row_stream);
            bufs.out.bytes = out_before;
            ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
                << headsum_last_error();
            ASSERT_TRUE(AllWithinBound(ref, bound, bufs.out.Read(),
                                       Layout{{c.b, c.h, c.sq, c.l}, "bhil"}));
          }
        }
      }
    }
  }
}

// The contiguous f32 view is the plain call, bit for bit.
TEST_P(TensorAttention, ContiguousF32IsThePlainCall) {
  for (const AttnCase& c : kAttnCases) {
    headsum_attn_shape shape = {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
    const size_t nq = size_t(c.b * c.h * c.sq * c.l), nkv = size_t(c.b * c.hkv * c.skv * c.l);
    std::vector<float> q = RandomUniform(nq, -1, 1, 7), k = RandomUniform(nkv, -1, 1, 8),
                       v = RandomUniform(nkv, -1, 1, 9), o1(nq), o2(nq);
    ASSERT_EQ(headsum_attention(&shape, q.data(), k.data(), v.data(), o1.data()), HEADSUM_OK);
    headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_F32, c.h, c.sq, c.l);
    headsum_tensor tk = headsum_bhsd(k.data(), HEADSUM_F32, c.hkv, c.skv, c.l);
    headsum_tensor tv = headsum_bhsd(v.data(), HEADSUM_F32, c.hkv, c.skv, c.l);
    headsum_tensor to = headsum_bhsd(o2.data(), HEADSUM_F32, c.h, c.sq, c.l);
    ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK);
    EXPECT_TRUE(BitwiseEqual(o1, o2, Layout{{c.b, c.h, c.sq, c.l}, "bhil"}));
  }
}

// The same f32 values at any 4-byte offset from a 64-byte boundary give the
// bits of 64-byte-aligned buffers: where a target reads misaligned K/V rows
// as aligned vectors (AVX-512 decode, L = 64 or 128), the products and sums
// are those of the aligned path, in its order.  Decode and two-row causal
// steps, MHA and GQA, key splits; the bytes around each buffer are NaN.
TEST_P(TensorAttention, OffsetF32BuffersGiveTheAlignedBits) {
  const AttnCase cases[] = {{1, 4, 4, 1, 1030, 64, false}, {1, 2, 2, 2, 300, 128, true},
                            {1, 8, 2, 1, 700, 64, false}, {2, 3, 3, 1, 33, 128, false}};
  for (const AttnCase& c : cases) {
    headsum_attn_shape shape = {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
    const size_t nq = size_t(c.b * c.h * c.sq * c.l), nkv = size_t(c.b * c.hkv * c.skv * c.l);
    const std::vector<float> q = RandomUniform(nq, -1, 1, 21), k = RandomUniform(nkv, -1, 1, 22),
                             v = RandomUniform(nkv, -1, 1, 23);
    // Copies of x at `offset` bytes past a 64-byte boundary, NaN around them.
    const auto place = [](std::vector<float>& store, const std::vector<float>& x, size_t offset) {
      store.assign(x.size() + 64, std::numeric_limits<float>::quiet_NaN());
      const uintptr_t p = reinterpret_cast<uintptr_t>(store.data()) + 16 * sizeof(float);
      float* at = reinterpret_cast<float*>((p & ~uintptr_t(63)) + offset);
      std::copy(x.begin(), x.end(), at);
      return at;
    };
    std::vector<float> aligned_out;
    for (size_t offset : {0, 4, 16, 20, 60}) {
      SCOPED_TRACE(offset);
      std::vector<float> qs, ks, vs, os;
      float* qp = place(qs, q, offset);
      float* kp = place(ks, k, offset);
      float* vp = place(vs, v, (offset * 3) % 64);  // V off by another amount
      float* op = place(os, std::vector<float>(nq, 0.0f), offset);
      ASSERT_EQ(headsum_attention(&shape, qp, kp, vp, op), HEADSUM_OK);
      std::vector<float> out(op, op + nq);
      if (offset == 0) {
        aligned_out = out;
        continue;
      }
      EXPECT_TRUE(BitwiseEqual(aligned_out, out, Layout{{c.b, c.h, c.sq, c.l}, "bhil"}))
          << "B" << c.b << " H" << c.h << " Hkv" << c.hkv << " Sq" << c.sq << " Skv" << c.skv
          << " L" << c.l;
    }
  }
}

// Token-major K/V (each thread copies a head's strided rows once per call
// and reads the copy for all of the head's query blocks) give the bits of the
// contiguous views, and K/V rewritten in place between two calls with the
// same pointers are read again: no copy outlives its call.  Several query
// blocks per head, GQA, causal with Sq < Skv, 1 and 2 threads.
TEST_P(TensorAttention, TokenMajorCopiesAreTheContiguousCallAndNeverStale) {
  const AttnCase cases[] = {{2, 4, 2, 65, 130, 33, true}, {1, 3, 3, 200, 200, 64, false},
                            {1, 2, 1, 129, 300, 17, true}};
  const DtypeCombo combos[] = {{HEADSUM_F32, HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},
                               {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F16, HEADSUM_F32}};
  for (const AttnCase& c : cases) {
    headsum_attn_shape shape = {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
    const size_t nq = size_t(c.b * c.h * c.sq * c.l), nkv = size_t(c.b * c.hkv * c.skv * c.l);
    const std::vector<float> q = RandomUniform(nq, -1, 1, 11);
    const std::vector<float> k1 = RandomUniform(nkv, -1, 1, 12), v1 = RandomUniform(nkv, -1, 1, 13);
    const std::vector<float> k2 = RandomUniform(nkv, -2, 2, 14), v2 = RandomUniform(nkv, -2, 2, 15);
    for (const DtypeCombo& t : combos) {
      for (int threads : {1, 2}) {
        ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
        AttnBuffers tm = MakeAttnBuffers(c, t, AttnLayout::kTokenMajor, q, k1, v1);
        for (int round = 0; round < 2; ++round) {
          const std::vector<float>& k = round == 0 ? k1 : k2;
          const std::vector<float>& v = round == 0 ? v1 : v2;
          if (round == 1) {  // same buffers, new values
            tm.k.Fill(k);
            tm.v.Fill(v);
          }
          AttnBuffers contiguous = MakeAttnBuffers(c, t, AttnLayout::kContiguous, q, k, v);
          headsum_tensor tq = tm.q.tensor(), tk = tm.k.tensor(), tv = tm.v.tensor(),
                         to = tm.out.tensor();
          ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
              << headsum_last_error();
          tq = contiguous.q.tensor(), tk = contiguous.k.tensor(), tv = contiguous.v.tensor(),
          to = contiguous.out.tensor();
          ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
              << headsum_last_error();
          EXPECT_TRUE(BitwiseEqual(contiguous.out.Read(), tm.out.Read(),
                                   Layout{{c.b, c.h, c.sq, c.l}, "bhil"}))
              << "Sq " << c.sq << " Skv " << c.skv << " L " << c.l << " K " << DtypeName(t.kv)
              << " threads " << threads << " round " << round;
        }
      }
      headsum_set_num_threads(0);
    }
  }
}

// Every dtype: the same bits for 1, 2 and 3 threads.
TEST_P(TensorAttention, DeterministicAcrossThreadCounts) {
  const AttnCase cases[] = {{2, 4, 2, 65, 130, 33, true}, {1, 8, 2, 1, 1030, 64, false}};
  for (const AttnCase& c : cases) {
    headsum_attn_shape shape = {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
    const size_t nq = size_t(c.b * c.h * c.sq * c.l), nkv = size_t(c.b * c.hkv * c.skv * c.l);
    const std::vector<float> q = RandomUniform(nq, -1, 1, 1), k = RandomUniform(nkv, -1, 1, 2),
                             v = RandomUniform(nkv, -1, 1, 3);
    for (const DtypeCombo& t : kCombos) {
      std::vector<std::vector<char>> outs;
      for (int threads : {1, 2, 3}) {
        ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
        AttnBuffers bufs = MakeAttnBuffers(c, t, AttnLayout::kTokenMajor, q, k, v);
        headsum_tensor tq = bufs.q.tensor(), tk = bufs.k.tensor(), tv = bufs.v.tensor(),
                       to = bufs.out.tensor();
        ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK);
        outs.push_back(bufs.out.bytes);
      }
      headsum_set_num_threads(0);
      EXPECT_EQ(outs[0], outs[1]) << DtypeName(t.kv);
      EXPECT_EQ(outs[0], outs[2]) << DtypeName(t.kv);
    }
  }
}

// A stride of 0 on an input: one K/V shared by the whole batch.
TEST_P(TensorAttention, ZeroBatchStrideSharesKv) {
  const int64_t B = 3, H = 2, S = 9, L = 8;
  headsum_attn_shape shape = {B, H, 0, S, S, L, 0.0f, 1};
  std::vector<float> q = RandomUniform(size_t(B * H * S * L), -1, 1, 4);
  std::vector<float> k1 = RandomUniform(size_t(H * S * L), -1, 1, 5);
  std::vector<float> v1 = RandomUniform(size_t(H * S * L), -1, 1, 6);
  std::vector<float> k, v, out(q.size());
  for (int b = 0; b < B; ++b) {
    k.insert(k.end(), k1.begin(), k1.end());
    v.insert(v.end(), v1.begin(), v1.end());
  }
  headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_F32, H, S, L);
  headsum_tensor tk = headsum_bhsd(k1.data(), HEADSUM_F32, H, S, L);
  headsum_tensor tv = headsum_bhsd(v1.data(), HEADSUM_F32, H, S, L);
  tk.strides[0] = 0;
  tv.strides[0] = 0;
  headsum_tensor to = headsum_bhsd(out.data(), HEADSUM_F32, H, S, L);
  ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
      << headsum_last_error();
  const RefAttnDims d(shape);
  EXPECT_TRUE(AllWithinBound(RefAttention(d, q.data(), k.data(), v.data()),
                             AttentionBound(d, q.data(), k.data(), v.data()), out,
                             Layout{{B, H, S, L}, "bhil"}));
}

// Every path of the attention table (dispatch/attention_paths.h), forced
// in turn, on every block it can compute, against the reference: so that
// each path runs on every target whatever this CPU's dispatch would pick.
// K/V counted as read from memory (the prefetching forms), and the stream
// in both of its modes.  Each path must have run rows on the targets that
// have it, and none where it does not exist.  Under the small sweep (qemu,
// sanitizers) every third case, f32 and bf16, contiguous views only.
TEST_P(TensorAttention, EveryPathOfTheTableMatchesReference) {
  using headsum::dispatch::AttnPathId;
  struct Restore {
    ~Restore() {
      headsum::testing::ForceAttentionPath(-1);
      headsum::testing::CountAttentionPathRows(false);
      headsum::testing::SetKvInCacheBytes(headsum::testing::kKvInCacheAuto);
      headsum::testing::SetRowStream(headsum::testing::kRowStreamAuto);
    }
  } restore;
  if (NativeBf16Active()) GTEST_SKIP() << "a native bf16 path is in force";
  const std::string target = GetParam();
  const bool scalar = target == "SCALAR" || target == "EMU128";
  const bool avx512 = target == "AVX3" || target == "AVX3_DL";
  const bool scalable = target.rfind("SVE", 0) == 0;
  std::vector<AttnCase> cases(std::begin(kAttnCases), std::end(kAttnCases));
  cases.push_back({1, 2, 2, 63, 63, 64, true});    // one block short of a full one
  cases.push_back({1, 2, 1, 8, 600, 128, false});  // 8 rows that see the same keys
  cases.push_back({1, 2, 2, 4, 70, 16, false});
  const bool small = headsum_shapes::SmallSweepRequested();
  std::vector<DtypeCombo> combos = {{HEADSUM_F32, HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},
                                    {HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16}};
  if (!small) {
    combos.push_back({HEADSUM_F32, HEADSUM_F16, HEADSUM_F32, HEADSUM_F16});
    combos.push_back({HEADSUM_F32, HEADSUM_F16, HEADSUM_F32, HEADSUM_BF16});
  }
  std::vector<AttnLayout> layouts = {AttnLayout::kContiguous};
  if (!small) layouts.push_back(AttnLayout::kCache);
  headsum::testing::SetKvInCacheBytes(0);
  headsum::testing::CountAttentionPathRows(true);
  uint64_t seed = 900;
  for (size_t case_index = 0; case_index < cases.size(); ++case_index) {
    if (small && case_index % 3 != 0) continue;
    const AttnCase& c = cases[case_index];
    headsum_attn_shape shape = ShapeOf(c);
    const RefAttnDims d(shape);
    const std::vector<float> q0 = RandomUniform(QueryElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> k0 = RandomUniform(KvElements(c), -1.5f, 1.5f, ++seed);
    const std::vector<float> v0 = RandomUniform(KvElements(c), -1.0f, 1.0f, ++seed);
    for (const DtypeCombo& t : combos) {
      const std::vector<float> q = RoundedTo(q0, t.q), k = RoundedTo(k0, t.kv),
                               v = RoundedTo(v0, t.v);
      const std::vector<double> ref = RefAttention(d, q.data(), k.data(), v.data());
      const std::vector<double> bound = TensorAttentionBound(d, q, k, v, ref, t);
      for (AttnLayout layout : layouts) {
        AttnBuffers bufs = MakeAttnBuffers(c, t, layout, q, k, v);
        const std::vector<char> out_before = bufs.out.bytes;
        headsum_tensor tq = bufs.q.tensor(), tk = bufs.k.tensor(), tv = bufs.v.tensor(),
                       to = bufs.out.tensor();
        for (size_t p = 0; p < headsum::dispatch::kAttnPathCount; ++p) {
          const headsum::dispatch::AttnPath& path = headsum::dispatch::AttnPaths()[p];
          headsum::testing::ForceAttentionPath(static_cast<int>(path.id));
          for (const int row_stream : {1, 2}) {
            if (row_stream == 1 && path.id != AttnPathId::kRowStream) continue;
            SCOPED_TRACE(std::string("path ") + path.name +
                         (row_stream == 1 ? " (eight keys) " : " ") + LayoutName(layout) +
                         " q " + DtypeName(t.q) + " k " + DtypeName(t.kv) + " v " +
                         DtypeName(t.v) + " B" + std::to_string(c.b) + " H" +
                         std::to_string(c.h) + " Hkv" + std::to_string(c.hkv) + " Sq" +
                         std::to_string(c.sq) + " Skv" + std::to_string(c.skv) + " L" +
                         std::to_string(c.l) + (c.causal ? " causal" : ""));
            headsum::testing::SetRowStream(row_stream);
            bufs.out.bytes = out_before;
            ASSERT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
                << headsum_last_error();
            ASSERT_TRUE(AllWithinBound(ref, bound, bufs.out.Read(),
                                       Layout{{c.b, c.h, c.sq, c.l}, "bhil"}));
          }
        }
      }
    }
  }
  for (size_t p = 0; p < headsum::dispatch::kAttnPathCount; ++p) {
    const headsum::dispatch::AttnPath& path = headsum::dispatch::AttnPaths()[p];
    bool exists = true;
    if (path.id == AttnPathId::kGroups) exists = !scalar;
    if (path.id == AttnPathId::kRowStream) exists = !scalar && !scalable;
    if (path.id == AttnPathId::kRowShifted) exists = avx512;
    const uint64_t rows = headsum::testing::AttentionPathRows(static_cast<int>(path.id));
    if (exists) {
      EXPECT_GT(rows, 0u) << path.name << " never ran";
    } else {
      EXPECT_EQ(rows, 0u) << path.name << " ran where it does not exist";
    }
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(TensorAttention);

// ---------------------------------------------------------------------------
// Projection on views.

struct ProjCase {
  int64_t b, s, h, l, d;
};
const ProjCase kProjCases[] = {
    {1, 20, 8, 64, 512}, {2, 3, 3, 17, 65}, {1, 1, 2, 5, 49}, {1, 65, 4, 16, 100},
    {1, 1, 8, 64, 512}, {3, 2, 3, 17, 113},  // one and two rows: the decode tiles
    // One and two rows over all of a wide D in one column range: a 16-bit
    // Y tile of 2 D floats, more than a panel's 64 x 48.
    {1, 1, 2, 16, 2000}, {2, 2, 2, 8, 1601},
    // Rows in several blocks at H*L = 512 (128 rows each with a 512 KiB L2):
    // the panel filled by the first tile, read by the rest; a 5-row last block.
    {1, 133, 8, 64, 40},
};

struct ProjCombo {
  headsum_dtype o, wo, y;
};
const ProjCombo kProjCombos[] = {
    {HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},  {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F32},
    {HEADSUM_F32, HEADSUM_F16, HEADSUM_F32},  {HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16},
    {HEADSUM_F16, HEADSUM_F16, HEADSUM_F16},  {HEADSUM_F32, HEADSUM_F32, HEADSUM_BF16},
};

struct ProjBuffers {
  Strided o, wo, y;
};

// O token-major ([B][S][H][L] seen as [b][h][s][l]), Wo rows padded to
// D + 5, Y rows padded to D + 3 with a batch stride of S (D + 3) + 11.
ProjBuffers MakeProjBuffers(const ProjCase& c, const ProjCombo& t, bool strided,
                            const std::vector<float>& o, const std::vector<float>& wo) {
  ProjBuffers p;
  p.o = Make4(t.o, strided ? Layout4::kBshd : Layout4::kBhsd, c.b, c.h, c.s, c.l, 0xFF);
  const int64_t wo_dims[4] = {1, 1, c.h * c.l, c.d};
  const int64_t ldw = strided ? c.d + 5 : c.d;
  const int64_t wo_st[3] = {0, 0, ldw};
  p.wo = MakeView(t.wo, wo_dims, wo_st, size_t(c.h * c.l * ldw), 0xFF);
  const int64_t y_dims[4] = {c.b, 1, c.s, c.d};
  const int64_t ldy = strided ? c.d + 3 : c.d, sb = strided ? c.s * ldy + 11 : c.s * c.d;
  const int64_t y_st[3] = {sb, strided ? 977 : 0, ldy};  // h stride: unused, any value
  p.y = MakeView(t.y, y_dims, y_st, size_t(c.b * sb), 0xA5);
  p.o.Fill(o);
  p.wo.Fill(wo);
  return p;
}

// The thread counts of the projection's bitwise sweeps below: 1, 2 and 3;
// under HEADSUM_TEST_SWEEP=small (the sanitizers, qemu) 1 and 3, one thread
// and an uneven split, a third fewer calls (the two sweeps were the slowest
// tests there: SCALAR under ASan at -O1 144 and 63 s, each Arm target ~50
// and ~35 s under qemu).  The full sweep runs all three on every target.
// (WoAnywhereInACacheLineGivesTheSameBits also takes fewer offsets there.)
std::vector<int> BitwiseSweepThreads() {
  if (headsum_shapes::SmallSweepRequested()) return {1, 3};
  return {1, 2, 3};
}

class TensorProjection : public TargetTest {};

TEST_P(TensorProjection, EveryDtypeAndStrideMatchesReference) {
  uint64_t seed = 300;
  for (const ProjCase& c : kProjCases) {
    headsum_proj_shape shape = {c.b, c.s, c.h, c.l, c.d};
    const RefProjDims d(shape);
    const std::vector<float> o0 = RandomUniform(size_t(c.b * c.h * c.s * c.l), -1, 1, ++seed);
    const std::vector<float> wo0 = RandomUniform(size_t(c.h * c.l * c.d), -0.5f, 0.5f, ++seed);
    const std::vector<float> bias = RandomUniform(size_t(c.d), -1, 1, ++seed);
    for (const ProjCombo& t : kProjCombos) {
      const std::vector<float> o = RoundedTo(o0, t.o), wo = RoundedTo(wo0, t.wo);
      const std::vector<double> ref = RefConcatProject(d, o.data(), wo.data(), bias.data());
      std::vector<double> bound =
          ProjectionBound(d, AbsContributions(d, o.data(), wo.data()), nullptr, bias.data());
      for (size_t i = 0; i < bound.size(); ++i) {
        bound[i] += OutputRoundoff(t.y) * (std::fabs(ref[i]) + bound[i]) + OutputAbsFloor(t.y);
      }
      for (bool strided : {false, true}) {
        SCOPED_TRACE(std::string(strided ? "strided" : "contiguous") + " O " + DtypeName(t.o) +
                     " Wo " + DtypeName(t.wo) + " Y " + DtypeName(t.y) + " B" +
                     std::to_string(c.b) + " S" + std::to_string(c.s) + " H" +
                     std::to_string(c.h) + " L" + std::to_string(c.l) + " D" +
                     std::to_string(c.d));
        ProjBuffers p = MakeProjBuffers(c, t, strided, o, wo);
        const std::vector<char> y_before = p.y.bytes;
        headsum_tensor to = p.o.tensor(), tw = p.wo.tensor(), ty = p.y.tensor();
        ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, bias.data(), &ty),
                  HEADSUM_OK) << headsum_last_error();
        ASSERT_TRUE(AllWithinBound(ref, bound, p.y.Read(), Layout{{c.b, c.s, c.d}, "bsc"}));
        size_t written = 0;
        for (size_t i = 0; i < y_before.size(); ++i) written += y_before[i] != p.y.bytes[i];
        EXPECT_LE(written, size_t(c.b * c.s * c.d) * Bytes(t.y));

        // Packed once (in Wo's dtype): bitwise the unpacked result.
        headsum_wo_packed* packed = nullptr;
        ASSERT_EQ(headsum_wo_pack_tensor(&shape, &tw, &packed), HEADSUM_OK)
            << headsum_last_error();
        ProjBuffers p2 = MakeProjBuffers(c, t, strided, o, wo);
        headsum_tensor to2 = p2.o.tensor(), ty2 = p2.y.tensor();
        ASSERT_EQ(headsum_project_heads_sum_packed_tensors(&shape, &to2, packed, bias.data(),
                                                           &ty2),
                  HEADSUM_OK) << headsum_last_error();
        EXPECT_EQ(p.y.bytes, p2.y.bytes) << "packed differs from unpacked";

        // O packed in blocks from three rows on (the path of B x S >=
        // kCopyWoRows): the same bits, plain and packed Wo.  (One or two
        // rows a sequence never take it.)
        if (c.s < 3) {
          headsum_wo_free(packed);
          continue;
        }
        struct RestoreRows {
          ~RestoreRows() { headsum::testing::SetProjectionPackedFromRows(0); }
        } restore;
        headsum::testing::SetProjectionPackedFromRows(3);
        ProjBuffers p3 = MakeProjBuffers(c, t, strided, o, wo), p4 = p3;
        headsum_tensor to3 = p3.o.tensor(), tw3 = p3.wo.tensor(), ty3 = p3.y.tensor();
        headsum_tensor to4 = p4.o.tensor(), ty4 = p4.y.tensor();
        ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to3, &tw3, bias.data(), &ty3),
                  HEADSUM_OK) << headsum_last_error();
        ASSERT_EQ(headsum_project_heads_sum_packed_tensors(&shape, &to4, packed, bias.data(),
                                                           &ty4),
                  HEADSUM_OK) << headsum_last_error();
        headsum_wo_free(packed);
        EXPECT_EQ(p.y.bytes, p3.y.bytes) << "O packed in blocks differs (plain)";
        EXPECT_EQ(p.y.bytes, p4.y.bytes) << "O packed in blocks differs (packed Wo)";
      }
    }
  }
}

TEST_P(TensorProjection, ContiguousF32IsThePlainCall) {
  for (const ProjCase& c : kProjCases) {
    headsum_proj_shape shape = {c.b, c.s, c.h, c.l, c.d};
    std::vector<float> o = RandomUniform(size_t(c.b * c.h * c.s * c.l), -1, 1, 11);
    std::vector<float> wo = RandomUniform(size_t(c.h * c.l * c.d), -1, 1, 12);
    std::vector<float> bias = RandomUniform(size_t(c.d), -1, 1, 13);
    std::vector<float> y1(size_t(c.b * c.s * c.d)), y2(y1.size());
    ASSERT_EQ(headsum_project_heads_sum(&shape, o.data(), wo.data(), bias.data(), y1.data()),
              HEADSUM_OK);
    headsum_tensor to = headsum_bhsd(o.data(), HEADSUM_F32, c.h, c.s, c.l);
    headsum_tensor tw = headsum_bhsd(wo.data(), HEADSUM_F32, 1, c.h * c.l, c.d);
    headsum_tensor ty = headsum_bhsd(y2.data(), HEADSUM_F32, 1, c.s, c.d);
    ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, bias.data(), &ty),
              HEADSUM_OK) << headsum_last_error();
    EXPECT_TRUE(BitwiseEqual(y1, y2, Layout{{c.b, c.s, c.d}, "bsc"}));
  }
}

TEST_P(TensorProjection, DeterministicAcrossThreadCounts) {
  const ProjCase c = {2, 70, 4, 16, 100};
  headsum_proj_shape shape = {c.b, c.s, c.h, c.l, c.d};
  const std::vector<float> o = RandomUniform(size_t(c.b * c.h * c.s * c.l), -1, 1, 21);
  const std::vector<float> wo = RandomUniform(size_t(c.h * c.l * c.d), -1, 1, 22);
  struct RestoreRows {
    ~RestoreRows() { headsum::testing::SetProjectionPackedFromRows(0); }
  } restore;
  for (const ProjCombo& t : kProjCombos) {
    std::vector<std::vector<char>> ys;
    // O read in place (140 rows), then packed in blocks from three rows on.
    for (size_t from_rows : {0, 3}) {
      headsum::testing::SetProjectionPackedFromRows(from_rows);
      for (int threads : {1, 2, 3}) {
        ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
        ProjBuffers p = MakeProjBuffers(c, t, true, o, wo);
        headsum_tensor to = p.o.tensor(), tw = p.wo.tensor(), ty = p.y.tensor();
        ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty), HEADSUM_OK);
        ys.push_back(p.y.bytes);
      }
    }
    headsum::testing::SetProjectionPackedFromRows(0);
    headsum_set_num_threads(0);
    for (size_t i = 1; i < ys.size(); ++i) EXPECT_EQ(ys[0], ys[i]) << "call " << i;
  }
}

// A decode step (one row, S = 1) is the arithmetic of that row among many,
// summed over groups of heads: dispatch splits a decode step's heads into
// groups (testing::ProjectionDecodeHeadsPerGroup, from the shape and Wo's
// element size alone), so that each thread reads whole rows of Wo, and
// adds the groups' f32 partial rows in group order, rounding once.  So the
// row must be, bitwise, ((P_0 + P_1) + ...) rounded to Y's dtype, where P_g
// is what a many-row call gives for group g's heads alone (f32 Y, the bias
// in P_0 only), for every dtype, thread count, padded Wo and packed Wo.
// One group (a small Wo) is the many-row call's row itself.
TEST_P(TensorProjection, OneRowIsThatRowOfAManyRowCallSummedByHeadGroups) {
  // Rows per head off the sweeps' pairs of rows (L = 17, 5), columns past
  // the last pair of vectors (D = 113, 65, 49), wide D; H*L = D = 512 and
  // D = 2000 split into groups (8 and 2 of them), H = 5 into groups of one
  // (f32 Wo) or of 2, 2 and 1 (16-bit Wo).
  const ProjCase cases[] = {{2, 5, 8, 64, 512}, {1, 4, 3, 17, 113}, {1, 3, 2, 5, 65},
                            {1, 3, 4, 24, 49},  {1, 3, 2, 16, 2000}, {1, 3, 5, 40, 600}};
  uint64_t seed = 700;
  size_t split_cases = 0;
  for (const ProjCase& c : cases) {
    const headsum_proj_shape shape = {c.b, c.s, c.h, c.l, c.d};
    const headsum_proj_shape one = {c.b, 1, c.h, c.l, c.d};
    const std::vector<float> o0 = RandomUniform(size_t(c.b * c.h * c.s * c.l), -1, 1, ++seed);
    const std::vector<float> wo0 = RandomUniform(size_t(c.h * c.l * c.d), -0.5f, 0.5f, ++seed);
    const std::vector<float> bias = RandomUniform(size_t(c.d), -1, 1, ++seed);
    for (const ProjCombo& t : kProjCombos) {
      const std::vector<float> o = RoundedTo(o0, t.o), wo = RoundedTo(wo0, t.wo);
      const int64_t per_group = int64_t(headsum::testing::ProjectionDecodeHeadsPerGroup(
          size_t(c.b), 1, size_t(c.h), size_t(c.l), size_t(c.d), Bytes(t.wo)));
      ASSERT_GE(per_group, 1);
      ASSERT_LE(per_group, c.h);
      split_cases += per_group < c.h;
      for (bool strided : {false, true}) {
        SCOPED_TRACE(std::string(strided ? "strided" : "contiguous") + " O " + DtypeName(t.o) +
                     " Wo " + DtypeName(t.wo) + " Y " + DtypeName(t.y) + " S" +
                     std::to_string(c.s) + " H" + std::to_string(c.h) + " L" +
                     std::to_string(c.l) + " D" + std::to_string(c.d) + ", heads per group " +
                     std::to_string(per_group));
        ASSERT_EQ(headsum_set_num_threads(1), HEADSUM_OK);
        // Each group's many-row call: its heads of O and rows of Wo, f32 Y.
        std::vector<float> sums(size_t(c.b * c.s * c.d), 0.0f);  // [b][s][d]
        for (int64_t h0 = 0; h0 < c.h; h0 += per_group) {
          const int64_t hg = std::min(per_group, c.h - h0);
          const ProjCase cg = {c.b, c.s, hg, c.l, c.d};
          const headsum_proj_shape shape_g = {c.b, c.s, hg, c.l, c.d};
          std::vector<float> o_g(size_t(c.b * hg * c.s * c.l));  // [b][h][s][l]
          for (int64_t b = 0; b < c.b; ++b) {
            std::copy_n(&o[size_t(((b * c.h + h0) * c.s) * c.l)], size_t(hg * c.s * c.l),
                        &o_g[size_t(b * hg * c.s * c.l)]);
          }
          const std::vector<float> wo_g(wo.begin() + h0 * c.l * c.d,
                                        wo.begin() + (h0 + hg) * c.l * c.d);
          ProjBuffers g = MakeProjBuffers(cg, {t.o, t.wo, HEADSUM_F32}, strided, o_g, wo_g);
          headsum_tensor to = g.o.tensor(), tw = g.wo.tensor(), ty = g.y.tensor();
          ASSERT_EQ(headsum_project_heads_sum_tensors(&shape_g, &to, &tw,
                                                      h0 == 0 ? bias.data() : nullptr, &ty),
                    HEADSUM_OK) << headsum_last_error();
          const std::vector<float> y_g = g.y.Read();
          for (size_t i = 0; i < sums.size(); ++i) sums[i] = h0 == 0 ? y_g[i] : sums[i] + y_g[i];
        }
        const std::vector<float> want = RoundedTo(sums, t.y);
        ProjBuffers all = MakeProjBuffers(c, t, strided, o, wo);
        headsum_tensor tw_all = all.wo.tensor();
        headsum_wo_packed* packed = nullptr;
        ASSERT_EQ(headsum_wo_pack_tensor(&shape, &tw_all, &packed), HEADSUM_OK)
            << headsum_last_error();
        // One row's buffers, Wo written once (the calls only read it); O
        // refilled for each row, Y back to its fill pattern before each call.
        ProjBuffers p = MakeProjBuffers({c.b, 1, c.h, c.l, c.d}, t, strided,
                                        std::vector<float>(size_t(c.b * c.h * c.l)), wo);
        const std::vector<char> y_fill = p.y.bytes;
        for (int64_t s = 0; s < c.s; ++s) {
          std::vector<float> o_row(size_t(c.b * c.h * c.l));  // [b][h][0][l]
          for (int64_t bh = 0; bh < c.b * c.h; ++bh) {
            for (int64_t l = 0; l < c.l; ++l) o_row[bh * c.l + l] = o[(bh * c.s + s) * c.l + l];
          }
          p.o.Fill(o_row);
          // A 16-bit Wo swept one row a pass and two (testing::
          // SetProjectionSweepRows), and as dispatch chooses.
          for (int sweep : {1, 2, headsum::testing::kSweepRowsAuto}) {
            headsum::testing::SetProjectionSweepRows(sweep);
            for (int threads : BitwiseSweepThreads()) {
              for (bool use_packed : {false, true}) {
                ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
                p.y.bytes = y_fill;
                headsum_tensor o1 = p.o.tensor(), w1 = p.wo.tensor(), y1 = p.y.tensor();
                ASSERT_EQ(use_packed ? headsum_project_heads_sum_packed_tensors(
                                           &one, &o1, packed, bias.data(), &y1)
                                     : headsum_project_heads_sum_tensors(&one, &o1, &w1,
                                                                         bias.data(), &y1),
                          HEADSUM_OK) << headsum_last_error();
                const std::vector<float> y_row = p.y.Read();  // [b][0][d]
                size_t differ = 0;
                for (int64_t b = 0; b < c.b; ++b) {
                  differ += memcmp(&y_row[b * c.d], &want[(b * c.s + s) * c.d],
                                   size_t(c.d) * sizeof(float)) != 0;
                }
                EXPECT_EQ(differ, 0u) << "row " << s << " alone, " << threads << " threads, "
                                      << (use_packed ? "packed" : "plain") << " Wo, sweep "
                                      << sweep;
              }
            }
          }
          headsum::testing::SetProjectionSweepRows(headsum::testing::kSweepRowsAuto);
        }
        headsum_wo_free(packed);
      }
    }
  }
  // The split itself is exercised: at least the H*L = D = 512 and D = 2000
  // cases for every Wo dtype.
  EXPECT_GE(split_cases, 2 * std::size(kProjCombos));
  headsum_set_num_threads(0);
}

// Wo anywhere in a cache line: the in-place call (three rows or more) then
// starts its column panels where Wo's rows meet a 64-byte boundary, with a
// first panel before them, a last one at least 16 columns wide and each
// tail one overlapping vector.  The same bits as with Wo on a boundary (no
// peel there), for every dtype, thread count and element offset; row
// strides that keep the rows' alignment and one that does not (D = 113
// packed), panels too few for a peel (D = 77).
TEST_P(TensorProjection, WoAnywhereInACacheLineGivesTheSameBits) {
  struct Case {
    int64_t s, h, l, d, ldw;
  };
  const Case cases[] = {{20, 8, 64, 512, 512}, {9, 4, 16, 200, 224}, {3, 2, 24, 113, 128},
                        {33, 2, 32, 2000, 2016}, {5, 2, 8, 77, 96}, {12, 3, 8, 113, 113}};
  const ProjCombo combos[] = {{HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},
                              {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F32},
                              {HEADSUM_F16, HEADSUM_F16, HEADSUM_F16}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const headsum_proj_shape shape = {1, c.s, c.h, c.l, c.d};
    const int64_t rows = c.h * c.l;
    const std::vector<float> o0 = RandomUniform(size_t(c.h * c.s * c.l), -1, 1, ++seed);
    const std::vector<float> wo0 = RandomUniform(size_t(rows * c.d), -0.5f, 0.5f, ++seed);
    const std::vector<float> bias = RandomUniform(size_t(c.d), -1, 1, ++seed);
    for (const ProjCombo& t : combos) {
      const size_t wb = Bytes(t.wo), yb = Bytes(t.y);
      std::vector<char> o(o0.size() * Bytes(t.o));
      for (size_t i = 0; i < o0.size(); ++i) EncodeElement(o0[i], &o[i * Bytes(t.o)], t.o);
      headsum_tensor to = headsum_bhsd(o.data(), t.o, c.h, c.s, c.l);
      std::vector<char> wo_bytes(size_t(rows * c.ldw) * wb + 128);
      char* line = reinterpret_cast<char*>(
          (reinterpret_cast<uintptr_t>(wo_bytes.data()) + 63) & ~uintptr_t{63});
      // Wo's rows encoded once, NaN padding past column D; copied to each offset.
      std::vector<char> wo_rows(size_t(rows * c.ldw) * wb, static_cast<char>(0xFF));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t col = 0; col < c.d; ++col) {
          EncodeElement(wo0[r * c.d + col], &wo_rows[size_t(r * c.ldw + col) * wb], t.wo);
        }
      }
      std::vector<char> want;
      const size_t offsets = 64 / wb;
      for (size_t e = 0; e < offsets; ++e) {
        // Under the small sweep (sanitizers, qemu) the two large cases take
        // four offsets (on a boundary, one element past, one before the
        // middle, the last); the small ones keep every offset.
        if (headsum_shapes::SmallSweepRequested() && c.d >= 512 && e > 1 &&
            e != offsets / 2 - 1 && e != offsets - 1) {
          continue;
        }
        char* wo = line + e * wb;
        std::fill(wo_bytes.begin(), wo_bytes.end(), static_cast<char>(0xFF));  // NaN padding
        std::copy(wo_rows.begin(), wo_rows.end(), wo);
        headsum_tensor tw;
        tw.data = wo;
        tw.dtype = t.wo;
        tw.strides[0] = tw.strides[1] = 0;
        tw.strides[2] = c.ldw;
        for (int threads : BitwiseSweepThreads()) {
          SCOPED_TRACE("O " + std::string(DtypeName(t.o)) + " Wo " + DtypeName(t.wo) + " Y " +
                       DtypeName(t.y) + " S" + std::to_string(c.s) + " D" +
                       std::to_string(c.d) + " ldw " + std::to_string(c.ldw) + ", Wo " +
                       std::to_string(e * wb) + " bytes past a line, " +
                       std::to_string(threads) + " threads");
          ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
          std::vector<char> y(size_t(c.s * c.d) * yb, static_cast<char>(0xA5));
          headsum_tensor ty;
          ty.data = y.data();
          ty.dtype = t.y;
          ty.strides[0] = c.s * c.d;
          ty.strides[1] = 0;
          ty.strides[2] = c.d;
          ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, bias.data(), &ty),
                    HEADSUM_OK) << headsum_last_error();
          if (want.empty()) {
            want = y;  // Wo on a 64-byte boundary, one thread
            continue;
          }
          size_t differ = 0;
          for (size_t i = 0; i < y.size(); i += yb) differ += memcmp(&y[i], &want[i], yb) != 0;
          EXPECT_EQ(differ, 0u);
        }
      }
    }
  }
  headsum_set_num_threads(0);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(TensorProjection);

// ---------------------------------------------------------------------------
// headsum_convert: bit-exact against the conversions above.

std::vector<float> ConversionInputs() {
  std::vector<float> x;
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65519.996f, 65520.0f,
                  -65520.0f, 65536.0f, 1e-8f, -1e-8f, 2.9802322e-08f, 5.9604645e-08f,
                  8.940697e-08f, 6.1035156e-05f, 6.097555e-05f, 3.4e38f, -3.4e38f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  1.0e-40f, -1.0e-40f, 1.17549435e-38f}) {
    x.push_back(f);
  }
  // Every f16 value, the midpoints between neighbours (ties) and the floats
  // just around them.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double a = F16ToDouble(static_cast<uint16_t>(h)),
                 b = F16ToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in f32
    for (float f : {static_cast<float>(a), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, inf)}) {
      x.push_back(f);
      x.push_back(-f);
    }
  }
  // bf16 ties (low half 0x8000), both parities, and random bit patterns
  // (NaN payloads included).
  uint64_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = static_cast<uint32_t>(state >> 32);
    if (i % 4 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;
    float f;
    memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  return x;
}

class TensorConvert : public TargetTest {};

TEST_P(TensorConvert, BitExactOnTiesSubnormalsNanOverflowAndSignedZero) {
  const std::vector<float> x = ConversionInputs();
  const int64_t n = static_cast<int64_t>(x.size());
  // [1][1][rows][cols] covering x, with a row stride past cols.
  const int64_t cols = 97, rows = (n + cols - 1) / cols;
  std::vector<float> src(size_t(rows * cols), 0.0f);
  std::copy(x.begin(), x.end(), src.begin());
  for (headsum_dtype to : {HEADSUM_F16, HEADSUM_BF16}) {
    const int64_t dims[4] = {1, 1, rows, cols};
    headsum_tensor ts = headsum_bhsd(src.data(), HEADSUM_F32, 1, rows, cols);
    std::vector<uint16_t> dst(size_t(rows * (cols + 1)), 0xDEAD);
    headsum_tensor td = headsum_bhsd(dst.data(), to, 1, rows, cols + 1);
    ASSERT_EQ(headsum_convert(dims, &ts, &td), HEADSUM_OK) << headsum_last_error();
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float f = src[size_t(r * cols + c)];
        const uint16_t got = dst[size_t(r * (cols + 1) + c)];
        const uint16_t want = to == HEADSUM_F16 ? DoubleToF16Bits(f) : DoubleToBF16Bits(f);
        // NaN: any NaN of the right sign class will do ("NaN stays NaN").
        const bool ok = std::isnan(f) ? (to == HEADSUM_F16 ? ((got & 0x7C00) == 0x7C00 && (got & 0x3FF))
                                                          : ((got & 0x7F80) == 0x7F80 && (got & 0x7F)))
                                      : got == want;
        if (!ok && ++bad <= 5) {
          uint32_t bits;
          memcpy(&bits, &f, 4);
          ADD_FAILURE() << DtypeName(to) << ": f32 0x" << std::hex << bits << " (" << f
                        << ") gave 0x" << got << ", expected 0x" << want;
        }
      }
      EXPECT_EQ(dst[size_t(r * (cols + 1) + cols)], 0xDEAD) << "wrote past the view";
    }
    EXPECT_EQ(bad, 0u);
    // And back: widening is exact.
    std::vector<float> back(size_t(rows * cols), 1.0f);
    headsum_tensor tb = headsum_bhsd(back.data(), HEADSUM_F32, 1, rows, cols);
    ASSERT_EQ(headsum_convert(dims, &td, &tb), HEADSUM_OK) << headsum_last_error();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t h = dst[size_t(r * (cols + 1) + c)];
        const double want = to == HEADSUM_F16 ? F16ToDouble(h) : BF16ToDouble(h);
        const float got = back[size_t(r * cols + c)];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got));
        } else {
          ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << h;
        }
      }
    }
  }
  // f16 <-> bf16 directly: one rounding of the exact value.
  std::vector<uint16_t> f16(size_t(0x7C00));
  for (uint32_t h = 0; h < 0x7C00; ++h) f16[h] = static_cast<uint16_t>(h);
  std::vector<uint16_t> bf(f16.size());
  const int64_t dims[4] = {1, 1, 1, 0x7C00};
  headsum_tensor ts = headsum_bhsd(f16.data(), HEADSUM_F16, 1, 1, 0x7C00);
  headsum_tensor td = headsum_bhsd(bf.data(), HEADSUM_BF16, 1, 1, 0x7C00);
  ASSERT_EQ(headsum_convert(dims, &ts, &td), HEADSUM_OK);
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    ASSERT_EQ(bf[h], DoubleToBF16Bits(F16ToDouble(static_cast<uint16_t>(h)))) << h;
  }
}

// A new token's K into a 16-bit cache: strided 4-D destination.
TEST_P(TensorConvert, AppendsRowsIntoACache) {
  const int64_t B = 2, G = 3, cap = 11, L = 19, len = 4, S = 2;
  std::vector<uint16_t> cache(size_t(B * G * cap * L), 0x7FC0);  // bf16 NaN everywhere
  std::vector<float> k_new = RandomUniform(size_t(B * S * G * L), -2, 2, 31);  // [B][S][G][L]
  headsum_tensor src = headsum_bshd(k_new.data(), HEADSUM_F32, G, S, L);
  headsum_tensor dst = headsum_bhsd(cache.data(), HEADSUM_BF16, G, cap, L);
  dst.data = cache.data() + len * L;  // position len
  const int64_t dims[4] = {B, G, S, L};
  ASSERT_EQ(headsum_convert(dims, &src, &dst), HEADSUM_OK) << headsum_last_error();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t p = 0; p < cap; ++p)
        for (int64_t l = 0; l < L; ++l) {
          const uint16_t got = cache[size_t(((b * G + g) * cap + p) * L + l)];
          if (p >= len && p < len + S) {
            const float f = k_new[size_t(((b * S + (p - len)) * G + g) * L + l)];
            ASSERT_EQ(got, DoubleToBF16Bits(f));
          } else {
            ASSERT_EQ(got, 0x7FC0) << "position " << p << " was written";
          }
        }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(TensorConvert);

// ---------------------------------------------------------------------------
// Validation: each rule gives HEADSUM_ERR_INVALID_ARGUMENT, a message naming
// the tensor, and no output written.

struct ValidationFixture {
  static constexpr int64_t B = 1, H = 2, S = 5, L = 8;
  headsum_attn_shape shape = {B, H, 0, S, S, L, 0.0f, 0};
  std::vector<float> q = RandomUniform(size_t(B * H * S * L), -1, 1, 1);
  std::vector<float> k = RandomUniform(size_t(B * H * S * L), -1, 1, 2);
  std::vector<float> v = RandomUniform(size_t(B * H * S * L), -1, 1, 3);
  std::vector<float> out = Sentinels(size_t(B * H * S * L) + 64);
  headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_F32, H, S, L);
  headsum_tensor tk = headsum_bhsd(k.data(), HEADSUM_F32, H, S, L);
  headsum_tensor tv = headsum_bhsd(v.data(), HEADSUM_F32, H, S, L);
  headsum_tensor to = headsum_bhsd(out.data(), HEADSUM_F32, H, S, L);

  testing::AssertionResult Refused(const char* needle1, const char* needle2) {
    const std::vector<float> before = out;
    const headsum_status s = headsum_attention_tensors(&shape, &tq, &tk, &tv, &to);
    if (s != HEADSUM_ERR_INVALID_ARGUMENT) {
      return testing::AssertionFailure() << "status " << StatusName(s);
    }
    const std::string msg = headsum_last_error();
    if (msg.find(needle1) == std::string::npos || msg.find(needle2) == std::string::npos) {
      return testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << needle1
                                         << "\" or \"" << needle2 << "\"";
    }
    if (memcmp(before.data(), out.data(), out.size() * sizeof(float)) != 0) {
      return testing::AssertionFailure() << "output written on failure";
    }
    return testing::AssertionSuccess();
  }
};

TEST(TensorValidation, AttentionRules) {
  {
    ValidationFixture f;
    EXPECT_EQ(headsum_attention_tensors(&f.shape, &f.tq, &f.tk, &f.tv, &f.to), HEADSUM_OK);
  }
  {
    ValidationFixture f;
    const headsum_status s = headsum_attention_tensors(&f.shape, nullptr, &f.tk, &f.tv, &f.to);
    EXPECT_EQ(s, HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find("q is NULL"), std::string::npos);
  }
  {
    ValidationFixture f;
    f.tk.data = nullptr;
    EXPECT_TRUE(f.Refused("k->data", "NULL"));
  }
  {
    ValidationFixture f;
    const int bogus = 7;
    memcpy(&f.tv.dtype, &bogus, sizeof bogus);
    EXPECT_TRUE(f.Refused("v->dtype = 7", "headsum_dtype"));
  }
  {
    ValidationFixture f;
    const int bogus = -1;
    memcpy(&f.tq.dtype, &bogus, sizeof bogus);
    EXPECT_TRUE(f.Refused("q->dtype = -1", "headsum_dtype"));
  }
  {
    ValidationFixture f;
    f.tq.strides[1] = -40;
    EXPECT_TRUE(f.Refused("q->strides[1]", "negative"));
  }
  {
    ValidationFixture f;
    f.tk.data = reinterpret_cast<char*>(f.k.data()) + 2;
    EXPECT_TRUE(f.Refused("k->data", "aligned"));
  }
  {
    ValidationFixture f;
    f.tk.dtype = HEADSUM_BF16;
    f.tk.data = reinterpret_cast<char*>(f.k.data()) + 1;
    EXPECT_TRUE(f.Refused("k->data", "aligned"));
  }
  {
    ValidationFixture f;
    f.to.strides[2] = 4;  // rows of 8 overlap
    EXPECT_TRUE(f.Refused("out", "same element"));
  }
  {
    ValidationFixture f;
    f.to.strides[1] = 0;  // both heads into one place
    EXPECT_TRUE(f.Refused("out", "same element"));
  }
  {
    ValidationFixture f;
    f.to.data = f.q.data() + 3;  // out overlaps q
    EXPECT_EQ(headsum_attention_tensors(&f.shape, &f.tq, &f.tk, &f.tv, &f.to),
              HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find("overlaps input q"), std::string::npos);
  }
  {
    ValidationFixture f;
    f.tv.strides[0] = INT64_MAX / 2;  // (B-1) = 0: fine
    EXPECT_EQ(headsum_attention_tensors(&f.shape, &f.tq, &f.tk, &f.tv, &f.to), HEADSUM_OK);
    f.shape.batch = 2;
    f.tq.strides[0] = 0;
    f.tk.strides[0] = 0;
    f.tv.strides[0] = INT64_MAX / 2;
    f.to.strides[0] = 0;  // out b stride 0 with B = 2: aliasing, but v is checked first
    EXPECT_TRUE(f.Refused("v", "overflow"));
  }
  {
    ValidationFixture f;
    f.tq.strides[2] = INT64_MAX / 3;
    EXPECT_TRUE(f.Refused("q", "overflow"));
  }
  {
    // Strides that do not nest but never meet (h: 0, 2, 4; s: +0, +3 with
    // L = 1): a valid output; against the reference it is just another view.
    const int64_t H = 3, S = 2, L = 1;
    headsum_attn_shape shape = {1, H, 0, S, S, L, 0.0f, 0};
    std::vector<float> q = RandomUniform(size_t(H * S * L), -1, 1, 4), k = q, v = q;
    std::vector<float> out(8, kSentinel);
    headsum_tensor tq = headsum_bhsd(q.data(), HEADSUM_F32, H, S, L);
    headsum_tensor tk = tq, tv = tq;
    headsum_tensor to = {out.data(), HEADSUM_F32, {0, 2, 3}};
    EXPECT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to), HEADSUM_OK)
        << headsum_last_error();
    to.strides[2] = 4;  // h: 0, 2, 4; s: +4: 4 twice
    std::fill(out.begin(), out.end(), kSentinel);
    EXPECT_EQ(headsum_attention_tensors(&shape, &tq, &tk, &tv, &to),
              HEADSUM_ERR_INVALID_ARGUMENT);
    // The message names two indices that meet: (h, s) = (0, 1) and (2, 0),
    // both at offset 4.
    const std::string message = headsum_last_error();
    EXPECT_NE(message.find("same element"), std::string::npos);
    EXPECT_NE(message.find("(0, 0, 1, 0) and (0, 2, 0, 0)"), std::string::npos) << message;
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == kSentinel; }));
  }
  {
    // An output index of extent 1 may have stride 0; an input any stride >= 0.
    ValidationFixture f;
    f.shape.heads = 1;
    f.shape.kv_heads = 1;
    f.to.strides[1] = 0;
    f.tq.strides[1] = 0;
    EXPECT_EQ(headsum_attention_tensors(&f.shape, &f.tq, &f.tk, &f.tv, &f.to), HEADSUM_OK)
        << headsum_last_error();
  }
}

TEST(TensorValidation, ProjectionAndConvertRules) {
  const int64_t B = 1, S = 3, H = 2, L = 4, D = 6;
  headsum_proj_shape shape = {B, S, H, L, D};
  std::vector<float> o = RandomUniform(size_t(B * H * S * L), -1, 1, 1);
  std::vector<float> wo = RandomUniform(size_t(H * L * D), -1, 1, 2);
  std::vector<float> y = Sentinels(size_t(B * S * D));
  headsum_tensor to = headsum_bhsd(o.data(), HEADSUM_F32, H, S, L);
  headsum_tensor tw = headsum_bhsd(wo.data(), HEADSUM_F32, 1, H * L, D);
  headsum_tensor ty = headsum_bhsd(y.data(), HEADSUM_F32, 1, S, D);
  ASSERT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty), HEADSUM_OK);
  std::fill(y.begin(), y.end(), kSentinel);  // (in place: ty points into y)
  const std::vector<float> before = y;
  // wo's and y's unused strides are ignored, even negative.
  tw.strides[0] = -5;
  ty.strides[1] = -9;
  EXPECT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty), HEADSUM_OK)
      << headsum_last_error();
  std::copy(before.begin(), before.end(), y.begin());
  ty.strides[2] = 2;  // rows of 6 overlap
  EXPECT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("y"), std::string::npos);
  EXPECT_EQ(y, before);
  ty.strides[2] = D;
  tw.strides[2] = -1;
  EXPECT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("wo->strides[2]"), std::string::npos);
  tw.strides[2] = D;
  // y over wo; y over the bias.
  headsum_tensor ty_bad = ty;
  ty_bad.data = wo.data() + 5;
  EXPECT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, nullptr, &ty_bad),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("overlaps input wo"), std::string::npos);
  EXPECT_EQ(headsum_project_heads_sum_tensors(&shape, &to, &tw, y.data() + 2, &ty),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("overlaps input bias"), std::string::npos);
  EXPECT_EQ(y, before);
  // Packed: null handle, shape mismatch.
  EXPECT_EQ(headsum_project_heads_sum_packed_tensors(&shape, &to, nullptr, nullptr, &ty),
            HEADSUM_ERR_INVALID_ARGUMENT);
  headsum_wo_packed* packed = nullptr;
  EXPECT_EQ(headsum_wo_pack_tensor(&shape, nullptr, &packed), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(packed, nullptr);
  // Convert: dims, overlap.
  const int64_t dims[4] = {1, 1, S, D};
  std::vector<uint16_t> dst(size_t(S * D), 0xBEEF);
  headsum_tensor ts = headsum_bhsd(y.data(), HEADSUM_F32, 1, S, D);
  headsum_tensor td = headsum_bhsd(dst.data(), HEADSUM_BF16, 1, S, D);
  const int64_t zero_dims[4] = {1, 0, S, D};
  EXPECT_EQ(headsum_convert(zero_dims, &ts, &td), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("dims[1] = 0"), std::string::npos);
  EXPECT_EQ(headsum_convert(nullptr, &ts, &td), HEADSUM_ERR_INVALID_ARGUMENT);
  headsum_tensor td_bad = td;
  td_bad.data = y.data();
  EXPECT_EQ(headsum_convert(dims, &ts, &td_bad), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("overlaps input src"), std::string::npos);
  td_bad = td;
  td_bad.strides[2] = 0;
  EXPECT_EQ(headsum_convert(dims, &ts, &td_bad), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("same element"), std::string::npos);
  EXPECT_EQ(y, before);
  for (uint16_t x : dst) EXPECT_EQ(x, 0xBEEF);
}

}  // namespace
}  // namespace headsum_test
