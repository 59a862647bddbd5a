// The oneDNN-composed attention over a KV cache (onednn::Attention with a
// kv_capacity, kernels/onednn/onednn_ref.h): K and V [B][Hkv][cap][L] with
// only the first Skv tokens of each head filled and NaN in the rest, as the
// layer benchmark's oneDNN generation loop reads its growing cache.  Must
// equal the double reference over the filled tokens and the contiguous
// composed attention over a copy of them.  Built only with oneDNN.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "kernels/onednn/onednn_ref.h"
#include "kernels/shapes.h"
#include "reference.h"
#include "test_util.h"

namespace headsum_test {
namespace {

struct CacheCase {
  MhaShape shape;
  int64_t capacity;  // tokens per kv head in the cache, >= shape.seq_kv
};

std::vector<CacheCase> CacheCases() {
  return {
      // Decode steps: one query row over a partly filled cache.
      {MhaShape{1, 8, 0, 1, 300, 64, 64, true}, 768},
      {MhaShape{1, 8, 0, 1, 513, 64, 64, true}, 514},
      {MhaShape{2, 4, 2, 1, 77, 17, 17, true}, 100},
      // Prefill into an empty cache, and a chunk of rows after cached ones
      // (causal, bottom-right).
      {MhaShape{1, 8, 0, 64, 64, 64, 64, true}, 96},
      {MhaShape{1, 2, 1, 16, 40, 32, 32, true}, 64},
      {MhaShape{2, 6, 3, 5, 33, 20, 20, false}, 35},
      // Causal rows that see no key (Sq > Skv): zeros, not the NaN tail.
      {MhaShape{1, 2, 2, 6, 4, 8, 8, true}, 7},
      {MhaShape{2, 2, 1, 1, 1, 5, 5, true}, 3},
  };
}

// AttnDims as the C API resolves a headsum_attn_shape (scale 0: 1/sqrt(L)).
headsum::AttnDims Dims(const MhaShape& s) {
  headsum::AttnDims a;
  a.batch = size_t(s.batch);
  a.heads = size_t(s.heads);
  a.kv_heads = size_t(s.resolved_kv_heads());
  a.seq_q = size_t(s.seq_q);
  a.seq_kv = size_t(s.seq_kv);
  a.head_dim = size_t(s.head_dim);
  a.scale = static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  a.causal = s.causal;
  return a;
}

// [B*Hkv][Skv][L] copied into [B*Hkv][cap][L], NaN in every unfilled token.
std::vector<float> IntoCache(const MhaShape& s, int64_t cap, const std::vector<float>& kv) {
  const int64_t heads = s.batch * s.resolved_kv_heads(), L = s.head_dim;
  std::vector<float> cache(size_t(heads * cap * L), std::numeric_limits<float>::quiet_NaN());
  for (int64_t g = 0; g < heads; ++g) {
    std::memcpy(cache.data() + g * cap * L, kv.data() + g * s.seq_kv * L,
                sizeof(float) * size_t(s.seq_kv * L));
  }
  return cache;
}

TEST(OnednnTwins, StridedCacheAttentionEqualsReferenceAndContiguous) {
  const std::vector<CacheCase> cases = CacheCases();
  for (size_t n = 0; n < cases.size(); ++n) {
    const MhaShape& s = cases[n].shape;
    const int64_t cap = cases[n].capacity;
    SCOPED_TRACE(s.name() + " cap " + std::to_string(cap));
    const headsum::AttnDims a = Dims(s);
    const auto q = RandomUniform(s.q_elems(), -1.0f, 1.0f, 4 * (9000 + n) + 1);
    const auto k = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * (9000 + n) + 2);
    const auto v = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * (9000 + n) + 3);
    const std::vector<float> k_cache = IntoCache(s, cap, k), v_cache = IntoCache(s, cap, v);
    const headsum_attn_shape shape = s.attn();
    const RefAttnDims d(shape);
    const std::vector<double> ref = RefAttention(d, q.data(), k.data(), v.data());
    const std::vector<double> bound = AttentionBound(d, q.data(), k.data(), v.data());
    for (int threads : {1, 2}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      std::vector<float> strided = Sentinels(s.out_elems()), contiguous = Sentinels(s.out_elems());
      ASSERT_EQ(headsum::onednn::Attention(a, size_t(cap), q.data(), k_cache.data(),
                                           v_cache.data(), strided.data(), threads),
                HEADSUM_OK)
          << headsum::onednn::LastErrorDetail();
      ASSERT_EQ(headsum::onednn::Attention(a, q.data(), k.data(), v.data(), contiguous.data(),
                                           threads),
                HEADSUM_OK)
          << headsum::onednn::LastErrorDetail();
      EXPECT_TRUE(AllWithinBound(ref, bound, strided, HeadsLayout(s)));
      // Each is within `bound` of the exact result, so within twice it of
      // each other (oneDNN may block a strided operand differently).
      std::vector<double> twice(bound.size());
      for (size_t i = 0; i < bound.size(); ++i) twice[i] = 2 * bound[i];
      EXPECT_TRUE(AllWithinBound(std::vector<double>(contiguous.begin(), contiguous.end()), twice,
                                 strided, HeadsLayout(s)));
    }
  }
}

TEST(OnednnTwins, StridedCacheAttentionRefusesCapacityBelowSeqKv) {
  const MhaShape s{1, 1, 1, 1, 4, 2, 2, false};
  const headsum::AttnDims a = Dims(s);
  const std::vector<float> q(2, 1.0f), kv(8, 1.0f);
  std::vector<float> out = Sentinels(2);
  EXPECT_EQ(headsum::onednn::Attention(a, 3, q.data(), kv.data(), kv.data(), out.data(), 1),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, Sentinels(2));
}

}  // namespace
}  // namespace headsum_test
