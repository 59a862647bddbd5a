// The whole layer (headsum_mha_*, headsum_kv_cache_*) on every compiled
// target, against the double reference of the whole layer (reference.cc:
// projections, RoPE, attention, output projection) within LayerBound:
// with and without RoPE, biases NULL and not, MHA/GQA/MQA, Dm != H*L,
// causal and not; a KV cache filled by a prefill and single-token steps;
// 16-bit caches and weights; overflow, reset, shards, and every bad input;
// the layer with options (headsum_mha_create_ex: window, softcap, ALiBi,
// sinks), alone and together, whole and in shards.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "headsum/headsum.hpp"
#include "reference.h"
#include "test_util.h"

namespace headsum_test {
namespace {

enum Bias : int { kBq = 1, kBk = 2, kBv = 4, kBo = 8, kAllBiases = 15 };

struct LayerCase {
  const char* name;
  int64_t batch, seq, model_dim, heads, kv_heads, head_dim;  // kv_heads 0: = heads
  bool causal;
  float rope_theta;
  int biases;  // which of Bias are given (the others NULL)

  int64_t kv() const { return kv_heads == 0 ? heads : kv_heads; }
};

// Sizes off the vector edges, every head arrangement, both masks.
const std::vector<LayerCase>& LayerCases() {
  static const std::vector<LayerCase> cases = {
      {"mha_rope_biases", 1, 20, 64, 4, 0, 16, true, 10000.0f, kAllBiases},
      {"gqa_dm_ne_hl_no_bias", 2, 13, 48, 4, 2, 8, false, 0.0f, 0},
      {"mqa_rope_half_5", 1, 9, 40, 6, 1, 10, true, 500.0f, kBq | kBv},
      {"odd_head_dim_no_rope", 2, 5, 17, 3, 3, 7, true, 0.0f, kBk | kBo},
      {"one_token_gqa", 3, 1, 32, 2, 1, 16, false, 10000.0f, kAllBiases},
      {"seed_shape", 1, 20, 512, 8, 0, 64, true, 10000.0f, kBo},
  };
  return cases;
}

// The cases the cache tests run, whose reference recomputes every token seen
// at every step: under HEADSUM_TEST_SWEEP=small (qemu) without the seed shape.
std::vector<LayerCase> CacheCases() {
  std::vector<LayerCase> out;
  for (const LayerCase& c : LayerCases()) {
    if (!headsum_shapes::SmallSweepRequested() || c.model_dim < 512) out.push_back(c);
  }
  return out;
}

// Inputs of a case: the whole layer's weights and x [B][S][Dm].  Weights are
// uniform in +-2/sqrt(fan-in) so that activations and scores stay O(1) and
// the softmax is neither flat nor one-hot.
struct LayerInputs {
  LayerInputs(const LayerCase& c, uint64_t seed, int64_t tokens)
      : wq(Weights(c.model_dim, c.heads * c.head_dim, seed + 1)),
        wk(Weights(c.model_dim, c.kv() * c.head_dim, seed + 2)),
        wv(Weights(c.model_dim, c.kv() * c.head_dim, seed + 3)),
        wo(Weights(c.heads * c.head_dim, c.model_dim, seed + 4)),
        bq(RandomUniform(size_t(c.heads * c.head_dim), -0.5f, 0.5f, seed + 5)),
        bk(RandomUniform(size_t(c.kv() * c.head_dim), -0.5f, 0.5f, seed + 6)),
        bv(RandomUniform(size_t(c.kv() * c.head_dim), -0.5f, 0.5f, seed + 7)),
        bo(RandomUniform(size_t(c.model_dim), -0.5f, 0.5f, seed + 8)),
        x(RandomUniform(size_t(c.batch * tokens * c.model_dim), -1.0f, 1.0f, seed + 9)),
        biases(c.biases) {}

  static std::vector<float> Weights(int64_t fan_in, int64_t cols, uint64_t seed) {
    const float a = 2.0f / std::sqrt(float(fan_in));
    return RandomUniform(size_t(fan_in * cols), -a, a, seed);
  }
  const float* Bias(int which, const std::vector<float>& b) const {
    return (biases & which) ? b.data() : nullptr;
  }

  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo, x;
  int biases;
};

headsum_mha_config Config(const LayerCase& c, headsum_dtype weights = HEADSUM_F32,
                          headsum_dtype cache = HEADSUM_F32) {
  headsum_mha_config config;
  config.model_dim = c.model_dim;
  config.heads = c.heads;
  config.kv_heads = c.kv_heads;
  config.head_dim = c.head_dim;
  config.causal = c.causal ? 1 : 0;
  config.rope_theta = c.rope_theta;
  config.weight_dtype = weights;
  config.cache_dtype = cache;
  return config;
}

// Columns [c0, c1) of a row-major [rows][cols] array.
std::vector<float> Columns(const std::vector<float>& a, int64_t cols, int64_t c0, int64_t c1) {
  const int64_t rows = int64_t(a.size()) / cols;
  std::vector<float> out;
  out.reserve(size_t(rows * (c1 - c0)));
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), a.begin() + r * cols + c0, a.begin() + r * cols + c1);
  }
  return out;
}

// One shard's own slices (heads [h0, h1), whole kv groups), or the whole
// layer for [0, H); with `weights` 16-bit, rounded as the layer stores them
// (for the reference; the layer itself gets the f32 originals).
struct ShardWeights {
  ShardWeights(const LayerCase& c, const LayerInputs& in, int64_t h0, int64_t h1,
               headsum_dtype weights = HEADSUM_F32) {
    const int64_t L = c.head_dim, group = c.heads / c.kv();
    const int64_t g0 = h0 / group, g1 = h1 / group;
    heads = h1 - h0;
    kv_heads = g1 - g0;
    wq = Columns(in.wq, c.heads * L, h0 * L, h1 * L);
    wk = Columns(in.wk, c.kv() * L, g0 * L, g1 * L);
    wv = Columns(in.wv, c.kv() * L, g0 * L, g1 * L);
    wo.assign(in.wo.begin() + h0 * L * c.model_dim, in.wo.begin() + h1 * L * c.model_dim);
    bq.assign(in.bq.begin() + h0 * L, in.bq.begin() + h1 * L);
    bk.assign(in.bk.begin() + g0 * L, in.bk.begin() + g1 * L);
    bv.assign(in.bv.begin() + g0 * L, in.bv.begin() + g1 * L);
    bo = in.bo;
    biases = in.biases;
    first = h0 == 0;
    if (weights != HEADSUM_F32) {
      for (std::vector<float>* w : {&wq, &wk, &wv, &wo}) {
        for (float& v : *w) v = float(RefRoundTo(weights, v));
      }
    }
  }
  const float* Bias(int which, const std::vector<float>& b) const {
    return (biases & which) ? b.data() : nullptr;
  }
  // What the reference computes with.  bo: only in the shard at head 0.
  RefLayerSpec Spec(const LayerCase& c, headsum_dtype cache = HEADSUM_F32) const {
    return RefLayerSpec{c.model_dim, heads, kv_heads, c.head_dim, c.causal,
                        double(c.rope_theta), cache, wq.data(), wk.data(), wv.data(),
                        wo.data(), Bias(kBq, bq), Bias(kBk, bk), Bias(kBv, bv),
                        first ? Bias(kBo, bo) : nullptr};
  }

  int64_t heads, kv_heads;
  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;
  int biases;
  bool first;
};

testing::AssertionResult Failed(const char* fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

// RAII for the C handles.
struct Layer {
  Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;
  ~Layer() { headsum_mha_free(mha); }
  headsum_mha* mha = nullptr;
};
struct Cache {
  Cache() = default;
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  ~Cache() { headsum_kv_cache_free(cache); }
  headsum_kv_cache* cache = nullptr;
};

headsum_status CreateWhole(const LayerInputs& in,
                           const headsum_mha_config& config, headsum_mha** mha) {
  return headsum_mha_create(&config, in.wq.data(), in.wk.data(), in.wv.data(), in.wo.data(),
                            in.Bias(kBq, in.bq), in.Bias(kBk, in.bk), in.Bias(kBv, in.bv),
                            in.Bias(kBo, in.bo), mha);
}

// Tokens [t0, t1) of x [B][T][Dm], as [B][t1 - t0][Dm].
std::vector<float> Tokens(const std::vector<float>& x, int64_t B, int64_t T, int64_t Dm,
                          int64_t t0, int64_t t1) {
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b) {
    out.insert(out.end(), x.begin() + (b * T + t0) * Dm, x.begin() + (b * T + t1) * Dm);
  }
  return out;
}

Layout LayerYLayout(int64_t B, int64_t S, int64_t Dm) { return {{B, S, Dm}, "bsd"}; }

// Runs `mha` over tokens [0, T) of x in the chunks `chunks` (lengths, summing
// to T) through one cache, and checks every chunk's y against the reference
// of the tokens it covers (each seeing the tokens before it).
testing::AssertionResult ChunksMatchReference(const LayerCase& c, const headsum_mha* mha,
                                              const RefLayerSpec& spec,
                                              const std::vector<float>& x, int64_t T,
                                              const std::vector<int64_t>& chunks) {
  const int64_t B = c.batch, Dm = c.model_dim;
  Cache cache;
  headsum_status st = headsum_kv_cache_create(mha, B, T, &cache.cache);
  if (st) return Failed("headsum_kv_cache_create", st);
  int64_t t0 = 0;
  for (int64_t n : chunks) {
    const int64_t t1 = t0 + n;
    const std::vector<float> x_chunk = Tokens(x, B, T, Dm, t0, t1);
    std::vector<float> y = Sentinels(size_t(B * n * Dm));
    st = headsum_mha_forward(mha, cache.cache, B, n, x_chunk.data(), y.data());
    if (st) return Failed("headsum_mha_forward", st);
    if (headsum_kv_cache_length(cache.cache) != t1) {
      return testing::AssertionFailure() << "cache length " << headsum_kv_cache_length(cache.cache)
                                         << " after tokens [0, " << t1 << ")";
    }
    const std::vector<float> x_seen = Tokens(x, B, T, Dm, 0, t1);
    auto r = AllWithinBound(RefLayerForward(spec, x_seen.data(), B, t1, t0),
                            LayerBound(spec, x_seen.data(), B, t1, t0), y,
                            LayerYLayout(B, n, Dm));
    if (!r) return r << " (tokens [" << t0 << ", " << t1 << ") through the cache)";
    t0 = t1;
  }
  return testing::AssertionSuccess();
}

// A prefill of P tokens, then single-token steps to T.
std::vector<int64_t> PrefillThenSteps(int64_t P, int64_t T) {
  std::vector<int64_t> chunks = {P};
  for (int64_t t = P; t < T; ++t) chunks.push_back(1);
  return chunks;
}

// ---- forward without a cache -------------------------------------------------

class LayerForward : public TargetTest {};

TEST_P(LayerForward, WithoutCacheMatchesReference) {
  for (size_t n = 0; n < LayerCases().size(); ++n) {
    const LayerCase& c = LayerCases()[n];
    SCOPED_TRACE(c.name);
    const LayerInputs in(c, 100 * n, c.seq);
    Layer layer;
    ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK) << headsum_last_error();
    std::vector<float> y = Sentinels(size_t(c.batch * c.seq * c.model_dim));
    ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, c.batch, c.seq, in.x.data(), y.data()),
              HEADSUM_OK)
        << headsum_last_error();
    const ShardWeights spec_weights(c, in, 0, c.heads);
  const RefLayerSpec spec = spec_weights.Spec(c);
    EXPECT_TRUE(AllWithinBound(RefLayerForward(spec, in.x.data(), c.batch, c.seq, 0),
                               LayerBound(spec, in.x.data(), c.batch, c.seq, 0), y,
                               LayerYLayout(c.batch, c.seq, c.model_dim)));
  }
}

// y may be x: the layer reads x before it writes y.
TEST_P(LayerForward, InPlaceEqualsOutOfPlaceBitwise) {
  const LayerCase& c = LayerCases()[0];
  const LayerInputs in(c, 7, c.seq);
  Layer layer;
  ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK) << headsum_last_error();
  std::vector<float> y(in.x.size()), xy = in.x;
  ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, c.batch, c.seq, in.x.data(), y.data()),
            HEADSUM_OK);
  ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, c.batch, c.seq, xy.data(), xy.data()),
            HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(y, xy, LayerYLayout(c.batch, c.seq, c.model_dim)));
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(LayerForward);

// ---- the KV cache ----------------------------------------------------------------

class LayerCache : public TargetTest {};

// Prefill P tokens, then T - P single-token steps: every step matches the
// reference of the tokens so far.
TEST_P(LayerCache, PrefillThenDecodeStepsMatchReference) {
  const std::vector<LayerCase> cases = CacheCases();
  for (size_t n = 0; n < cases.size(); ++n) {
    const LayerCase& c = cases[n];
    SCOPED_TRACE(c.name);
    const int64_t P = c.seq, T = c.seq + 5;
    const LayerInputs in(c, 200 + 100 * n, T);
    Layer layer;
    ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK) << headsum_last_error();
    EXPECT_TRUE(ChunksMatchReference(c, layer.mha, ShardWeights(c, in, 0, c.heads).Spec(c), in.x,
                                     T, PrefillThenSteps(P, T)));
  }
}

// Causal: prefill + steps give one forward over all the tokens, row for row
// (each within its bound of the exact result, so within the sum of the
// bounds of each other).
TEST_P(LayerCache, StepsEqualOneForwardOverAllTokens) {
  const std::vector<LayerCase> cases = CacheCases();
  for (size_t n = 0; n < cases.size(); ++n) {
    const LayerCase& c = cases[n];
    if (!c.causal) continue;
    SCOPED_TRACE(c.name);
    const int64_t B = c.batch, Dm = c.model_dim, P = c.seq, T = c.seq + 4;
    const LayerInputs in(c, 300 + 100 * n, T);
    Layer layer;
    ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK) << headsum_last_error();
    const ShardWeights spec_weights(c, in, 0, c.heads);
  const RefLayerSpec spec = spec_weights.Spec(c);
    std::vector<float> y_all(size_t(B * T * Dm));
    ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, B, T, in.x.data(), y_all.data()),
              HEADSUM_OK);
    const std::vector<double> bound_all = LayerBound(spec, in.x.data(), B, T, 0);
    Cache cache;
    ASSERT_EQ(headsum_kv_cache_create(layer.mha, B, T, &cache.cache), HEADSUM_OK);
    int64_t t0 = 0;
    for (int64_t len : PrefillThenSteps(P, T)) {
      const std::vector<float> x_chunk = Tokens(in.x, B, T, Dm, t0, t0 + len);
      std::vector<float> y(size_t(B * len * Dm));
      ASSERT_EQ(headsum_mha_forward(layer.mha, cache.cache, B, len, x_chunk.data(), y.data()),
                HEADSUM_OK);
      const std::vector<float> x_seen = Tokens(in.x, B, T, Dm, 0, t0 + len);
      std::vector<double> bound = LayerBound(spec, x_seen.data(), B, t0 + len, t0);
      std::vector<double> expected(bound.size());
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t r = 0; r < len * Dm; ++r) {
          const size_t mine = size_t(b * len * Dm + r), all = size_t((b * T + t0) * Dm + r);
          expected[mine] = y_all[all];
          bound[mine] += bound_all[all];
        }
      }
      EXPECT_TRUE(AllWithinBound(expected, bound, y, LayerYLayout(B, len, Dm)))
          << "tokens [" << t0 << ", " << t0 + len << ")";
      t0 += len;
    }
  }
}

// 16-bit caches: K (after RoPE) and V rounded to nearest even once, as the
// reference rounds its exact K and V.
TEST_P(LayerCache, SixteenBitCachesMatchReferenceThatRoundsKv) {
  for (headsum_dtype dtype : {HEADSUM_F16, HEADSUM_BF16}) {
    const std::vector<LayerCase> cases = CacheCases();
    for (size_t n = 0; n < cases.size(); ++n) {
      const LayerCase& c = cases[n];
      SCOPED_TRACE(std::string(c.name) + (dtype == HEADSUM_F16 ? " f16" : " bf16"));
      const int64_t T = c.seq + 3;
      const LayerInputs in(c, 400 + 100 * n, T);
      Layer layer;
      ASSERT_EQ(CreateWhole(in, Config(c, HEADSUM_F32, dtype), &layer.mha), HEADSUM_OK)
          << headsum_last_error();
      EXPECT_TRUE(ChunksMatchReference(c, layer.mha,
                                       ShardWeights(c, in, 0, c.heads).Spec(c, dtype), in.x, T,
                                       PrefillThenSteps(c.seq, T)));
    }
  }
}

// 16-bit weights: the layer rounds them once; the reference computes with
// the same rounded values.
TEST_P(LayerCache, SixteenBitWeightsMatchReferenceWithRoundedWeights) {
  for (headsum_dtype dtype : {HEADSUM_F16, HEADSUM_BF16}) {
    const std::vector<LayerCase> cases = CacheCases();
    for (size_t n = 0; n < cases.size(); ++n) {
      const LayerCase& c = cases[n];
      SCOPED_TRACE(std::string(c.name) + (dtype == HEADSUM_F16 ? " f16" : " bf16"));
      const int64_t T = c.seq + 2;
      const LayerInputs in(c, 500 + 100 * n, T);
      Layer layer;
      ASSERT_EQ(CreateWhole(in, Config(c, dtype, dtype), &layer.mha), HEADSUM_OK)
          << headsum_last_error();
      EXPECT_TRUE(ChunksMatchReference(c, layer.mha,
                                       ShardWeights(c, in, 0, c.heads, dtype).Spec(c, dtype),
                                       in.x, T, PrefillThenSteps(c.seq, T)));
    }
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(LayerCache);

// A forward that would overflow the cache is refused and changes nothing:
// not the cache (its length, and what the next call sees), not y.
TEST(LayerCacheLimits, OverflowIsRefusedAndLeavesCacheAndYUntouched) {
  const LayerCase& c = LayerCases()[0];
  const int64_t B = c.batch, Dm = c.model_dim, cap = 10;
  const LayerInputs in(c, 600, cap);
  Layer layer;
  ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK);
  Cache cache;
  ASSERT_EQ(headsum_kv_cache_create(layer.mha, B, cap, &cache.cache), HEADSUM_OK);
  const std::vector<float> prefill = Tokens(in.x, B, cap, Dm, 0, 8);
  std::vector<float> y(size_t(B * 8 * Dm));
  ASSERT_EQ(headsum_mha_forward(layer.mha, cache.cache, B, 8, prefill.data(), y.data()),
            HEADSUM_OK);
  // Three more do not fit in 10: refused, y and the cache as they were.
  const std::vector<float> three = RandomUniform(size_t(B * 3 * Dm), -1, 1, 601);
  std::vector<float> y3 = Sentinels(three.size());
  EXPECT_EQ(headsum_mha_forward(layer.mha, cache.cache, B, 3, three.data(), y3.data()),
            HEADSUM_ERR_INVALID_ARGUMENT);
  const std::string message = headsum_last_error();
  EXPECT_NE(message.find("seq = 3"), std::string::npos) << message;
  EXPECT_NE(message.find("cache"), std::string::npos) << message;
  EXPECT_EQ(y3, Sentinels(three.size()));
  EXPECT_EQ(headsum_kv_cache_length(cache.cache), 8);
  // The next valid call (two tokens: exactly full) is right: the cache holds
  // tokens 0..7 and nothing of the refused three.
  const std::vector<float> two = Tokens(in.x, B, cap, Dm, 8, 10);
  std::vector<float> y2 = Sentinels(two.size());
  ASSERT_EQ(headsum_mha_forward(layer.mha, cache.cache, B, 2, two.data(), y2.data()),
            HEADSUM_OK)
      << headsum_last_error();
  EXPECT_EQ(headsum_kv_cache_length(cache.cache), cap);
  const ShardWeights spec_weights(c, in, 0, c.heads);
  const RefLayerSpec spec = spec_weights.Spec(c);
  EXPECT_TRUE(AllWithinBound(RefLayerForward(spec, in.x.data(), B, cap, 8),
                             LayerBound(spec, in.x.data(), B, cap, 8), y2,
                             LayerYLayout(B, 2, Dm)));
  // Full: even one more token is refused.
  std::vector<float> y1 = Sentinels(size_t(B * Dm));
  EXPECT_EQ(headsum_mha_forward(layer.mha, cache.cache, B, 1, two.data(), y1.data()),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(y1, Sentinels(size_t(B * Dm)));
}

// Reset empties the cache: what follows is what a new cache gives, bitwise.
TEST(LayerCacheLimits, ResetGivesWhatANewCacheGives) {
  const LayerCase& c = LayerCases()[2];
  const int64_t B = c.batch, Dm = c.model_dim, T = 12;
  const LayerInputs in(c, 700, T);
  Layer layer;
  ASSERT_EQ(CreateWhole(in, Config(c), &layer.mha), HEADSUM_OK);
  Cache used, fresh;
  ASSERT_EQ(headsum_kv_cache_create(layer.mha, B, T, &used.cache), HEADSUM_OK);
  ASSERT_EQ(headsum_kv_cache_create(layer.mha, B, T, &fresh.cache), HEADSUM_OK);
  const std::vector<float> other = RandomUniform(size_t(B * T * Dm), -1, 1, 701);
  std::vector<float> y(size_t(B * T * Dm));
  ASSERT_EQ(headsum_mha_forward(layer.mha, used.cache, B, T, other.data(), y.data()),
            HEADSUM_OK);
  EXPECT_EQ(headsum_kv_cache_length(used.cache), T);
  headsum_kv_cache_reset(used.cache);
  EXPECT_EQ(headsum_kv_cache_length(used.cache), 0);
  for (int64_t len : {int64_t{5}, int64_t{1}, int64_t{6}}) {
    const int64_t t0 = headsum_kv_cache_length(fresh.cache);
    const std::vector<float> x = Tokens(in.x, B, T, Dm, t0, t0 + len);
    std::vector<float> y_used(x.size()), y_fresh(x.size());
    ASSERT_EQ(headsum_mha_forward(layer.mha, used.cache, B, len, x.data(), y_used.data()),
              HEADSUM_OK);
    ASSERT_EQ(headsum_mha_forward(layer.mha, fresh.cache, B, len, x.data(), y_fresh.data()),
              HEADSUM_OK);
    EXPECT_TRUE(BitwiseEqual(y_used, y_fresh, LayerYLayout(B, len, Dm)));
  }
  EXPECT_EQ(headsum_kv_cache_length(used.cache), T);
  // Truncating to 5 and redoing the last tokens gives them again, bitwise.
  ASSERT_EQ(headsum_kv_cache_truncate(used.cache, 5), HEADSUM_OK);
  EXPECT_EQ(headsum_kv_cache_length(used.cache), 5);
  {
    const std::vector<float> x = Tokens(in.x, B, T, Dm, 5, T);
    std::vector<float> y_again(x.size()), y_first(x.size());
    ASSERT_EQ(headsum_mha_forward(layer.mha, used.cache, B, T - 5, x.data(), y_again.data()),
              HEADSUM_OK);
    ASSERT_EQ(headsum_kv_cache_truncate(fresh.cache, 5), HEADSUM_OK);
    ASSERT_EQ(headsum_mha_forward(layer.mha, fresh.cache, B, T - 5, x.data(), y_first.data()),
              HEADSUM_OK);
    EXPECT_TRUE(BitwiseEqual(y_again, y_first, LayerYLayout(B, T - 5, Dm)));
  }
  EXPECT_EQ(headsum_kv_cache_truncate(used.cache, T + 1), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("length = " + std::to_string(T + 1)),
            std::string::npos);
  EXPECT_EQ(headsum_kv_cache_truncate(used.cache, -1), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(headsum_kv_cache_truncate(nullptr, 0), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(headsum_kv_cache_length(used.cache), T);
  headsum_kv_cache_reset(nullptr);  // valid, does nothing
  EXPECT_EQ(headsum_kv_cache_length(nullptr), 0);
}

// ---- shards ----------------------------------------------------------------------

class LayerShards : public TargetTest {};

// 1, 2 and 4 shards (whole kv groups, each given only its own slices), each
// through its own cache: their outputs add up to the layer's (bo once).
TEST_P(LayerShards, ShardsSumToTheLayer) {
  const LayerCase c = {"shards", 2, 6, 40, 8, 4, 8, true, 10000.0f, kAllBiases};
  const int64_t B = c.batch, Dm = c.model_dim, T = 9;
  const LayerInputs in(c, 800, T);
  const ShardWeights whole_weights(c, in, 0, c.heads);
  const RefLayerSpec whole = whole_weights.Spec(c);
  for (int64_t shards : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    const int64_t per = c.heads / shards;
    std::vector<ShardWeights> weights;
    std::vector<Layer> layers(static_cast<size_t>(shards));
    std::vector<Cache> caches(static_cast<size_t>(shards));
    for (int64_t s = 0; s < shards; ++s) {
      weights.emplace_back(c, in, s * per, (s + 1) * per);
      const ShardWeights& w = weights.back();
      const headsum_mha_config config = Config(c);
      ASSERT_EQ(headsum_mha_create_shard(&config, s * per, (s + 1) * per, w.wq.data(),
                                         w.wk.data(), w.wv.data(), w.wo.data(),
                                         w.Bias(kBq, w.bq), w.Bias(kBk, w.bk),
                                         w.Bias(kBv, w.bv), w.Bias(kBo, w.bo),
                                         &layers[size_t(s)].mha),
                HEADSUM_OK)
          << headsum_last_error();
      ASSERT_EQ(headsum_kv_cache_create(layers[size_t(s)].mha, B, T, &caches[size_t(s)].cache),
                HEADSUM_OK);
    }
    int64_t t0 = 0;
    for (int64_t len : PrefillThenSteps(c.seq, T)) {
      const std::vector<float> x = Tokens(in.x, B, T, Dm, t0, t0 + len);
      const std::vector<float> x_seen = Tokens(in.x, B, T, Dm, 0, t0 + len);
      std::vector<double> sum(x.size(), 0.0), bound(x.size(), 0.0);
      for (int64_t s = 0; s < shards; ++s) {
        std::vector<float> y(x.size());
        ASSERT_EQ(headsum_mha_forward(layers[size_t(s)].mha, caches[size_t(s)].cache, B, len,
                                      x.data(), y.data()),
                  HEADSUM_OK)
            << headsum_last_error();
        const std::vector<double> b =
            LayerBound(weights[size_t(s)].Spec(c), x_seen.data(), B, t0 + len, t0);
        for (size_t i = 0; i < y.size(); ++i) {
          sum[i] += y[i];  // exact in double
          bound[i] += b[i];
        }
      }
      const std::vector<double> expected = RefLayerForward(whole, x_seen.data(), B, t0 + len, t0);
      // The double sum of the shards against the whole layer's exact output.
      std::vector<double> residual(sum.size());
      for (size_t i = 0; i < sum.size(); ++i) residual[i] = sum[i] - expected[i];
      std::vector<float> zeros(sum.size(), 0.0f);
      EXPECT_TRUE(AllWithinBound(residual, bound, zeros, LayerYLayout(B, len, Dm)))
          << "tokens [" << t0 << ", " << t0 + len << "): shards' sum - reference";
      t0 += len;
    }
  }
}

// bo belongs to the shard that starts at head 0: any other shard's output is
// bitwise the same with bo given or NULL.
TEST_P(LayerShards, OnlyTheShardAtHeadZeroAddsBo) {
  const LayerCase c = {"bo", 1, 5, 24, 4, 2, 6, true, 0.0f, kAllBiases};
  const LayerInputs in(c, 900, c.seq);
  const headsum_mha_config config = Config(c);
  for (int64_t h0 : {0, 2}) {
    const ShardWeights w(c, in, h0, h0 + 2);
    Layer with, without;
    ASSERT_EQ(headsum_mha_create_shard(&config, h0, h0 + 2, w.wq.data(), w.wk.data(),
                                       w.wv.data(), w.wo.data(), nullptr, nullptr, nullptr,
                                       w.bo.data(), &with.mha),
              HEADSUM_OK);
    ASSERT_EQ(headsum_mha_create_shard(&config, h0, h0 + 2, w.wq.data(), w.wk.data(),
                                       w.wv.data(), w.wo.data(), nullptr, nullptr, nullptr,
                                       nullptr, &without.mha),
              HEADSUM_OK);
    std::vector<float> y_with(in.x.size()), y_without(in.x.size());
    ASSERT_EQ(headsum_mha_forward(with.mha, nullptr, 1, c.seq, in.x.data(), y_with.data()),
              HEADSUM_OK);
    ASSERT_EQ(headsum_mha_forward(without.mha, nullptr, 1, c.seq, in.x.data(),
                                  y_without.data()),
              HEADSUM_OK);
    // y_with - y_without is bo at head 0 (exactly: the chain starts at bo, so
    // only within the projection's bound), zero elsewhere.
    size_t differing = 0;
    for (size_t i = 0; i < y_with.size(); ++i) differing += y_with[i] != y_without[i];
    if (h0 == 0) {
      EXPECT_GT(differing, y_with.size() / 2) << "bo was not added by the shard at head 0";
    } else {
      EXPECT_EQ(differing, 0u) << "the shard at head " << h0 << " added bo";
    }
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(LayerShards);

// ---- the layer with options (headsum_mha_create_ex) ------------------------------

// What a model adds to the layer's scores, for the whole layer: slopes and
// sinks [H] (empty: none).
struct LayerOptions {
  int64_t window = 0;
  float softcap = 0.0f;
  std::vector<float> slopes, sinks;

  headsum_attn_options C() const {
    return {window, softcap, slopes.empty() ? nullptr : slopes.data(),
            sinks.empty() ? nullptr : sinks.data(), nullptr};
  }
  // The reference of heads [h0, ...): the window, the softcap, their slice.
  RefLayerSpec Apply(RefLayerSpec spec, int64_t h0) const {
    spec.window = window;
    spec.softcap = softcap;
    spec.slopes = slopes.empty() ? nullptr : slopes.data() + h0;
    spec.sinks = sinks.empty() ? nullptr : sinks.data() + h0;
    return spec;
  }
};

struct LayerOptionsCase {
  LayerCase c;
  int64_t window;
  float softcap;  // scores are O(1) here: a cap of 1-2 bends them
  bool slopes, sinks;
  headsum_dtype cache = HEADSUM_F32;  // a 16-bit one: the decode paths over 16-bit K/V
};

// Each option alone, then together, over both masks, GQA/MQA, RoPE or not,
// f32 and 16-bit caches.
const std::vector<LayerOptionsCase>& LayerOptionsCases() {
  static const std::vector<LayerOptionsCase> cases = {
      {{"window_causal_rope_gqa", 1, 12, 48, 4, 2, 8, true, 10000.0f, kAllBiases}, 5, 0.0f,
       false, false},
      {{"window_not_causal", 2, 9, 24, 2, 2, 6, false, 0.0f, kBq}, 3, 0.0f, false, false},
      {{"softcap", 2, 7, 40, 4, 4, 10, true, 0.0f, kBq | kBo}, 0, 1.5f, false, false},
      {{"alibi_mqa_rope", 1, 9, 32, 6, 1, 8, true, 500.0f, kBk}, 0, 0.0f, true, false},
      {{"sinks_not_causal", 2, 6, 24, 4, 2, 6, false, 0.0f, 0}, 0, 0.0f, false, true},
      {{"all_not_causal", 1, 10, 40, 4, 2, 8, false, 10000.0f, kAllBiases}, 4, 2.0f, true, true},
      {{"all_bf16_cache_gqa", 2, 8, 64, 8, 2, 16, true, 10000.0f, kBv}, 6, 1.0f, true, true,
       HEADSUM_BF16},
      {{"sinks_window_f16_cache", 1, 11, 32, 4, 4, 8, true, 0.0f, kAllBiases}, 4, 0.0f, false,
       true, HEADSUM_F16},
      {{"all_causal_seed", 1, 20, 512, 8, 0, 64, true, 10000.0f, kBo}, 8, 2.0f, true, true},
  };
  return cases;
}

LayerOptions MakeOptions(const LayerOptionsCase& oc, uint64_t seed) {
  LayerOptions o;
  o.window = oc.window;
  o.softcap = oc.softcap;
  const int64_t H = oc.c.heads;
  if (oc.slopes) {  // BLOOM's 2^(-8 (h + 1) / H), scaled up to move O(1) scores
    for (int64_t h = 0; h < H; ++h) o.slopes.push_back(2.0f * std::exp2(-8.0f * (h + 1) / H));
  }
  if (oc.sinks) o.sinks = RandomUniform(size_t(H), -1.0f, 2.0f, seed);
  return o;
}

headsum_status CreateWholeEx(const LayerInputs& in, const headsum_mha_config& config,
                             const headsum_attn_options* options, headsum_mha** mha) {
  return headsum_mha_create_ex(&config, options, in.wq.data(), in.wk.data(), in.wv.data(),
                               in.wo.data(), in.Bias(kBq, in.bq), in.Bias(kBk, in.bk),
                               in.Bias(kBv, in.bv), in.Bias(kBo, in.bo), mha);
}

class LayerOptionsTest : public TargetTest {};

// Without a cache, and through one (a prefill, then single-token steps):
// every token within LayerBound of the reference with the same options.
TEST_P(LayerOptionsTest, EachOptionAndAllTogetherMatchReference) {
  const std::vector<LayerOptionsCase>& cases = LayerOptionsCases();
  for (size_t n = 0; n < cases.size(); ++n) {
    const LayerOptionsCase& oc = cases[n];
    const LayerCase& c = oc.c;
    if (headsum_shapes::SmallSweepRequested() && c.model_dim >= 512) continue;
    SCOPED_TRACE(c.name);
    const int64_t T = c.seq + 4;
    const LayerInputs in(c, 1000 + 100 * n, T);
    const LayerOptions options = MakeOptions(oc, 1050 + 100 * n);
    const headsum_attn_options opt = options.C();
    Layer layer;
    ASSERT_EQ(CreateWholeEx(in, Config(c, HEADSUM_F32, oc.cache), &opt, &layer.mha), HEADSUM_OK)
        << headsum_last_error();
    const ShardWeights w(c, in, 0, c.heads);
    const RefLayerSpec spec = options.Apply(w.Spec(c, oc.cache), 0);
    const RefLayerSpec spec_f32 = options.Apply(w.Spec(c), 0);  // no cache: K, V stay f32
    const std::vector<float> x_prompt = Tokens(in.x, c.batch, T, c.model_dim, 0, c.seq);
    std::vector<float> y = Sentinels(size_t(c.batch * c.seq * c.model_dim));
    ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, c.batch, c.seq, x_prompt.data(), y.data()),
              HEADSUM_OK)
        << headsum_last_error();
    EXPECT_TRUE(AllWithinBound(RefLayerForward(spec_f32, x_prompt.data(), c.batch, c.seq, 0),
                               LayerBound(spec_f32, x_prompt.data(), c.batch, c.seq, 0), y,
                               LayerYLayout(c.batch, c.seq, c.model_dim)))
        << "without a cache";
    EXPECT_TRUE(ChunksMatchReference(c, layer.mha, spec, in.x, T, PrefillThenSteps(c.seq, T)));
  }
}

// The options change the result: the layer without them is outside the
// bound of the reference with them (so the tests above test something).
TEST_P(LayerOptionsTest, OptionsChangeTheOutput) {
  const std::vector<LayerOptionsCase>& cases = LayerOptionsCases();
  for (size_t n = 0; n + 1 < cases.size(); ++n) {
    const LayerOptionsCase& oc = cases[n];
    const LayerCase& c = oc.c;
    SCOPED_TRACE(c.name);
    const LayerInputs in(c, 1000 + 100 * n, c.seq);
    const LayerOptions options = MakeOptions(oc, 1050 + 100 * n);
    Layer plain;
    ASSERT_EQ(CreateWhole(in, Config(c), &plain.mha), HEADSUM_OK) << headsum_last_error();
    std::vector<float> y(size_t(c.batch * c.seq * c.model_dim));
    ASSERT_EQ(headsum_mha_forward(plain.mha, nullptr, c.batch, c.seq, in.x.data(), y.data()),
              HEADSUM_OK);
    const ShardWeights w(c, in, 0, c.heads);
    const RefLayerSpec spec = options.Apply(w.Spec(c), 0);
    EXPECT_FALSE(AllWithinBound(RefLayerForward(spec, in.x.data(), c.batch, c.seq, 0),
                                LayerBound(spec, in.x.data(), c.batch, c.seq, 0), y,
                                LayerYLayout(c.batch, c.seq, c.model_dim)))
        << "the plain layer matches the reference with the options";
  }
}

// NULL options and zeroed ones are the plain layer, bitwise.
TEST_P(LayerOptionsTest, NoOptionsIsThePlainLayer) {
  const LayerCase& c = LayerCases()[0];
  const int64_t B = c.batch, Dm = c.model_dim, T = c.seq + 2;
  const LayerInputs in(c, 1900, T);
  const headsum_attn_options zeroed = {0, 0.0f, nullptr, nullptr, nullptr};
  Layer plain, null_options, zero_options;
  ASSERT_EQ(CreateWhole(in, Config(c), &plain.mha), HEADSUM_OK);
  ASSERT_EQ(CreateWholeEx(in, Config(c), nullptr, &null_options.mha), HEADSUM_OK);
  ASSERT_EQ(CreateWholeEx(in, Config(c), &zeroed, &zero_options.mha), HEADSUM_OK);
  std::vector<std::vector<float>> ys;
  for (const Layer* layer : {&plain, &null_options, &zero_options}) {
    Cache cache;
    ASSERT_EQ(headsum_kv_cache_create(layer->mha, B, T, &cache.cache), HEADSUM_OK);
    std::vector<float> y;
    int64_t t0 = 0;
    for (int64_t len : PrefillThenSteps(c.seq, T)) {
      const std::vector<float> x = Tokens(in.x, B, T, Dm, t0, t0 + len);
      std::vector<float> y_chunk(x.size());
      ASSERT_EQ(headsum_mha_forward(layer->mha, cache.cache, B, len, x.data(), y_chunk.data()),
                HEADSUM_OK);
      y.insert(y.end(), y_chunk.begin(), y_chunk.end());
      t0 += len;
    }
    ys.push_back(y);
  }
  EXPECT_TRUE(BitwiseEqual(ys[0], ys[1], LayerYLayout(B, T, Dm))) << "NULL options";
  EXPECT_TRUE(BitwiseEqual(ys[0], ys[2], LayerYLayout(B, T, Dm))) << "zeroed options";
}

// Shards made with the whole layer's options (slopes and sinks [H]) keep
// their heads' slice: their outputs, each through its own cache, add up to
// the layer's with the options.
TEST_P(LayerOptionsTest, ShardsWithOptionsSumToTheLayer) {
  const LayerOptionsCase oc = {{"shards", 2, 6, 40, 8, 4, 8, true, 10000.0f, kAllBiases},
                               3, 2.0f, true, true};
  const LayerCase& c = oc.c;
  const int64_t B = c.batch, Dm = c.model_dim, T = 9;
  const LayerInputs in(c, 2000, T);
  const LayerOptions options = MakeOptions(oc, 2050);
  const headsum_attn_options opt = options.C();
  const ShardWeights whole_weights(c, in, 0, c.heads);
  const RefLayerSpec whole = options.Apply(whole_weights.Spec(c), 0);
  for (int64_t shards : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    const int64_t per = c.heads / shards;
    std::vector<ShardWeights> weights;
    std::vector<Layer> layers(static_cast<size_t>(shards));
    std::vector<Cache> caches(static_cast<size_t>(shards));
    for (int64_t s = 0; s < shards; ++s) {
      weights.emplace_back(c, in, s * per, (s + 1) * per);
      const ShardWeights& w = weights.back();
      const headsum_mha_config config = Config(c);
      ASSERT_EQ(headsum_mha_create_shard_ex(&config, &opt, s * per, (s + 1) * per, w.wq.data(),
                                            w.wk.data(), w.wv.data(), w.wo.data(),
                                            w.Bias(kBq, w.bq), w.Bias(kBk, w.bk),
                                            w.Bias(kBv, w.bv), w.Bias(kBo, w.bo),
                                            &layers[size_t(s)].mha),
                HEADSUM_OK)
          << headsum_last_error();
      ASSERT_EQ(headsum_kv_cache_create(layers[size_t(s)].mha, B, T, &caches[size_t(s)].cache),
                HEADSUM_OK);
    }
    int64_t t0 = 0;
    for (int64_t len : PrefillThenSteps(c.seq, T)) {
      const std::vector<float> x = Tokens(in.x, B, T, Dm, t0, t0 + len);
      const std::vector<float> x_seen = Tokens(in.x, B, T, Dm, 0, t0 + len);
      std::vector<double> sum(x.size(), 0.0), bound(x.size(), 0.0);
      for (int64_t s = 0; s < shards; ++s) {
        std::vector<float> y(x.size());
        ASSERT_EQ(headsum_mha_forward(layers[size_t(s)].mha, caches[size_t(s)].cache, B, len,
                                      x.data(), y.data()),
                  HEADSUM_OK)
            << headsum_last_error();
        const RefLayerSpec spec = options.Apply(weights[size_t(s)].Spec(c), s * per);
        const std::vector<double> b = LayerBound(spec, x_seen.data(), B, t0 + len, t0);
        for (size_t i = 0; i < y.size(); ++i) {
          sum[i] += y[i];  // exact in double
          bound[i] += b[i];
        }
      }
      const std::vector<double> expected = RefLayerForward(whole, x_seen.data(), B, t0 + len, t0);
      std::vector<double> residual(sum.size());
      for (size_t i = 0; i < sum.size(); ++i) residual[i] = sum[i] - expected[i];
      std::vector<float> zeros(sum.size(), 0.0f);
      EXPECT_TRUE(AllWithinBound(residual, bound, zeros, LayerYLayout(B, len, Dm)))
          << "tokens [" << t0 << ", " << t0 + len << "): shards' sum - reference";
      t0 += len;
    }
  }
}

// The options are copied: the caller's slopes and sinks may change or go
// after creation.
TEST_P(LayerOptionsTest, OptionsAreCopied) {
  const LayerOptionsCase& oc = LayerOptionsCases()[5];
  const LayerCase& c = oc.c;
  const LayerInputs in(c, 2100, c.seq);
  LayerOptions options = MakeOptions(oc, 2150);
  const LayerOptions original = options;
  headsum_attn_options opt = options.C();
  Layer layer;
  ASSERT_EQ(CreateWholeEx(in, Config(c), &opt, &layer.mha), HEADSUM_OK) << headsum_last_error();
  for (float& v : options.slopes) v = std::numeric_limits<float>::quiet_NaN();
  for (float& v : options.sinks) v = 1e30f;
  std::vector<float> y(size_t(c.batch * c.seq * c.model_dim));
  ASSERT_EQ(headsum_mha_forward(layer.mha, nullptr, c.batch, c.seq, in.x.data(), y.data()),
            HEADSUM_OK);
  const ShardWeights w(c, in, 0, c.heads);
  const RefLayerSpec spec = original.Apply(w.Spec(c), 0);
  EXPECT_TRUE(AllWithinBound(RefLayerForward(spec, in.x.data(), c.batch, c.seq, 0),
                             LayerBound(spec, in.x.data(), c.batch, c.seq, 0), y,
                             LayerYLayout(c.batch, c.seq, c.model_dim)));
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(LayerOptionsTest);

}  // namespace
}  // namespace headsum_test
