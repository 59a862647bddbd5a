// Every bad input of the layer's calls is HEADSUM_ERR_INVALID_ARGUMENT, the
// message names the argument (and its value), and nothing is written: no
// handle handed out, y untouched, the cache as it was.  And the C++ face
// (Mha, KvCache) over the same calls.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "headsum/headsum.h"
#include "headsum/headsum.hpp"
#include "test_util.h"

namespace headsum_test {
namespace {

constexpr int64_t kDm = 12, kH = 4, kHkv = 2, kL = 6;

headsum_mha_config GoodConfig() {
  headsum_mha_config c;
  c.model_dim = kDm;
  c.heads = kH;
  c.kv_heads = kHkv;
  c.head_dim = kL;
  c.causal = 1;
  c.rope_theta = 10000.0f;
  c.weight_dtype = HEADSUM_F32;
  c.cache_dtype = HEADSUM_F32;
  return c;
}

struct Weights {
  std::vector<float> wq = RandomUniform(kDm * kH * kL, -0.5f, 0.5f, 1);
  std::vector<float> wk = RandomUniform(kDm * kHkv * kL, -0.5f, 0.5f, 2);
  std::vector<float> wv = RandomUniform(kDm * kHkv * kL, -0.5f, 0.5f, 3);
  std::vector<float> wo = RandomUniform(kH * kL * kDm, -0.5f, 0.5f, 4);
  std::vector<float> bo = RandomUniform(kDm, -0.5f, 0.5f, 5);
};

// A handle the call must not overwrite.
headsum_mha* const kUntouchedMha = reinterpret_cast<headsum_mha*>(uintptr_t{0x1234});
headsum_kv_cache* const kUntouchedCache = reinterpret_cast<headsum_kv_cache*>(uintptr_t{0x5678});

void ExpectInvalid(const std::string& what, headsum_status status,
                   const std::vector<std::string>& mentions) {
  SCOPED_TRACE(what);
  EXPECT_EQ(status, HEADSUM_ERR_INVALID_ARGUMENT) << StatusName(status);
  const std::string message = headsum_last_error();
  for (const std::string& m : mentions) {
    EXPECT_NE(message.find(m), std::string::npos) << "message \"" << message
                                                  << "\" does not mention \"" << m << "\"";
  }
}

TEST(LayerInvalid, CreateRejectsEveryBadConfigAndWeight) {
  const Weights w;
  struct Case {
    std::string what;
    headsum_mha_config config;
    std::vector<std::string> mentions;
  };
  std::vector<Case> cases;
  auto with = [&](std::string what, std::vector<std::string> mentions, auto change) {
    headsum_mha_config c = GoodConfig();
    change(c);
    cases.push_back({std::move(what), c, std::move(mentions)});
  };
  with("model_dim 0", {"model_dim", "0"}, [](headsum_mha_config& c) { c.model_dim = 0; });
  with("heads -1", {"heads", "-1"}, [](headsum_mha_config& c) { c.heads = -1; });
  with("head_dim 0", {"head_dim", "0"}, [](headsum_mha_config& c) { c.head_dim = 0; });
  with("kv_heads -2", {"kv_heads", "-2"}, [](headsum_mha_config& c) { c.kv_heads = -2; });
  with("kv_heads 3 of 4", {"kv_heads = 3", "heads = 4"},
       [](headsum_mha_config& c) { c.kv_heads = 3; });
  with("rope_theta NaN", {"rope_theta", "nan"},
       [](headsum_mha_config& c) { c.rope_theta = std::numeric_limits<float>::quiet_NaN(); });
  with("rope_theta -1", {"rope_theta", "-1"}, [](headsum_mha_config& c) { c.rope_theta = -1; });
  with("rope_theta inf", {"rope_theta", "inf"},
       [](headsum_mha_config& c) { c.rope_theta = std::numeric_limits<float>::infinity(); });
  with("odd head_dim with RoPE", {"head_dim = 5", "even"},
       [](headsum_mha_config& c) { c.head_dim = 5; });
  with("weight_dtype 7", {"weight_dtype", "7"},
       [](headsum_mha_config& c) { c.weight_dtype = static_cast<headsum_dtype>(7); });
  with("cache_dtype -1", {"cache_dtype", "-1"},
       [](headsum_mha_config& c) { c.cache_dtype = static_cast<headsum_dtype>(-1); });
  with("overflowing model_dim", {"1152921504606846976"},  // the overflowing dim's value
       [](headsum_mha_config& c) { c.model_dim = int64_t{1} << 60; });
  for (const Case& c : cases) {
    headsum_mha* mha = kUntouchedMha;
    ExpectInvalid(c.what,
                  headsum_mha_create(&c.config, w.wq.data(), w.wk.data(), w.wv.data(),
                                     w.wo.data(), nullptr, nullptr, nullptr, nullptr, &mha),
                  c.mentions);
    EXPECT_EQ(mha, kUntouchedMha) << c.what;
  }
  const headsum_mha_config good = GoodConfig();
  headsum_mha* mha = kUntouchedMha;
  ExpectInvalid("config NULL", headsum_mha_create(nullptr, w.wq.data(), w.wk.data(), w.wv.data(),
                                                   w.wo.data(), nullptr, nullptr, nullptr,
                                                   nullptr, &mha),
                {"config"});
  ExpectInvalid("wq NULL", headsum_mha_create(&good, nullptr, w.wk.data(), w.wv.data(),
                                               w.wo.data(), nullptr, nullptr, nullptr, nullptr,
                                               &mha),
                {"wq"});
  ExpectInvalid("wk NULL", headsum_mha_create(&good, w.wq.data(), nullptr, w.wv.data(),
                                               w.wo.data(), nullptr, nullptr, nullptr, nullptr,
                                               &mha),
                {"wk"});
  ExpectInvalid("wv NULL", headsum_mha_create(&good, w.wq.data(), w.wk.data(), nullptr,
                                               w.wo.data(), nullptr, nullptr, nullptr, nullptr,
                                               &mha),
                {"wv"});
  ExpectInvalid("wo NULL", headsum_mha_create(&good, w.wq.data(), w.wk.data(), w.wv.data(),
                                               nullptr, nullptr, nullptr, nullptr, nullptr,
                                               &mha),
                {"wo"});
  EXPECT_EQ(mha, kUntouchedMha);
  ExpectInvalid("mha NULL", headsum_mha_create(&good, w.wq.data(), w.wk.data(), w.wv.data(),
                                                w.wo.data(), nullptr, nullptr, nullptr, nullptr,
                                                nullptr),
                {"mha"});
}

TEST(LayerInvalid, ShardRangesMustBeWholeKvGroupsInside) {
  const Weights w;  // big enough for any shard of the layer
  const headsum_mha_config config = GoodConfig();  // 4 heads, 2 per kv head
  const struct {
    int64_t begin, end;
    std::vector<std::string> mentions;
  } cases[] = {
      {-2, 2, {"head_begin = -2"}},       {0, 6, {"head_end = 6", "heads = 4"}},
      {2, 2, {"non-empty"}},              {3, 1, {"non-empty"}},
      {1, 3, {"head_begin = 1", "group"}}, {0, 3, {"head_end = 3", "group"}},
  };
  for (const auto& c : cases) {
    headsum_mha* mha = kUntouchedMha;
    ExpectInvalid("[" + std::to_string(c.begin) + ", " + std::to_string(c.end) + ")",
                  headsum_mha_create_shard(&config, c.begin, c.end, w.wq.data(), w.wk.data(),
                                           w.wv.data(), w.wo.data(), nullptr, nullptr, nullptr,
                                           nullptr, &mha),
                  c.mentions);
    EXPECT_EQ(mha, kUntouchedMha);
  }
  headsum_mha* mha = nullptr;
  ASSERT_EQ(headsum_mha_create_shard(&config, 2, 4, w.wq.data(), w.wk.data(), w.wv.data(),
                                     w.wo.data(), nullptr, nullptr, nullptr, w.bo.data(), &mha),
            HEADSUM_OK)
      << headsum_last_error();
  headsum_mha_free(mha);
}

// headsum_mha_create_ex and _shard_ex: every rule of the options
// (headsum_attention_tensors_ex's, over the whole layer's heads even in a
// shard) and the bias the layer does not take, each named; no handle.
TEST(LayerInvalid, CreateExRejectsEveryBadOption) {
  const Weights w;
  const headsum_mha_config config = GoodConfig();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float good[kH] = {0.5f, 0.25f, 0.125f, 0.0625f};
  const float slope_nan[kH] = {0.5f, 0.25f, 0.125f, nan};  // head 3: outside shard [0, 2)
  const float sink_inf[kH] = {0.0f, -inf, 1.0f, 2.0f};
  std::vector<float> bias_data(16, 0.0f);
  const headsum_tensor bias = {bias_data.data(), HEADSUM_F32, {0, 0, 0}};
  struct Rule {
    const char* what;
    headsum_attn_options opt;
    std::vector<std::string> mentions;
  };
  const Rule rules[] = {
      {"window < 0", {-1, 0.0f, nullptr, nullptr, nullptr}, {"options->window = -1"}},
      {"softcap < 0", {0, -2.0f, nullptr, nullptr, nullptr}, {"options->softcap", "-2"}},
      {"softcap NaN", {0, nan, nullptr, nullptr, nullptr}, {"options->softcap", "nan"}},
      {"softcap inf", {0, inf, nullptr, nullptr, nullptr}, {"options->softcap", "inf"}},
      {"slope NaN", {0, 0.0f, slope_nan, nullptr, nullptr}, {"options->alibi_slopes[3]", "nan"}},
      {"sink -inf", {0, 0.0f, nullptr, sink_inf, nullptr}, {"options->sinks[1]", "inf"}},
      {"a bias", {0, 0.0f, good, good, &bias}, {"options->bias", "no bias"}},
  };
  for (const Rule& r : rules) {
    headsum_mha* mha = kUntouchedMha;
    ExpectInvalid(std::string("create_ex: ") + r.what,
                  headsum_mha_create_ex(&config, &r.opt, w.wq.data(), w.wk.data(), w.wv.data(),
                                        w.wo.data(), nullptr, nullptr, nullptr, nullptr, &mha),
                  r.mentions);
    EXPECT_NE(std::string(headsum_last_error()).find("headsum_mha_create_ex"), std::string::npos);
    EXPECT_EQ(mha, kUntouchedMha);
    ExpectInvalid(std::string("create_shard_ex: ") + r.what,
                  headsum_mha_create_shard_ex(&config, &r.opt, 0, 2, w.wq.data(), w.wk.data(),
                                              w.wv.data(), w.wo.data(), nullptr, nullptr,
                                              nullptr, nullptr, &mha),
                  r.mentions);
    EXPECT_NE(std::string(headsum_last_error()).find("headsum_mha_create_shard_ex"),
              std::string::npos);
    EXPECT_EQ(mha, kUntouchedMha);
  }
  // The rules of create and create_shard come first, as they do there.
  headsum_mha* mha = kUntouchedMha;
  const headsum_attn_options ok = {3, 30.0f, good, good, nullptr};
  ExpectInvalid("create_ex config NULL",
                headsum_mha_create_ex(nullptr, &ok, w.wq.data(), w.wk.data(), w.wv.data(),
                                      w.wo.data(), nullptr, nullptr, nullptr, nullptr, &mha),
                {"config"});
  ExpectInvalid("create_shard_ex split group",
                headsum_mha_create_shard_ex(&config, &ok, 1, 3, w.wq.data(), w.wk.data(),
                                            w.wv.data(), w.wo.data(), nullptr, nullptr, nullptr,
                                            nullptr, &mha),
                {"head_begin = 1", "group"});
  ExpectInvalid("create_ex wq NULL",
                headsum_mha_create_ex(&config, &ok, nullptr, w.wk.data(), w.wv.data(),
                                      w.wo.data(), nullptr, nullptr, nullptr, nullptr, &mha),
                {"wq"});
  ExpectInvalid("create_ex mha NULL",
                headsum_mha_create_ex(&config, &ok, w.wq.data(), w.wk.data(), w.wv.data(),
                                      w.wo.data(), nullptr, nullptr, nullptr, nullptr, nullptr),
                {"mha"});
  EXPECT_EQ(mha, kUntouchedMha);
  // Valid options, NULL options: a layer each.
  for (const headsum_attn_options* opt : {&ok, static_cast<const headsum_attn_options*>(nullptr)}) {
    mha = nullptr;
    ASSERT_EQ(headsum_mha_create_ex(&config, opt, w.wq.data(), w.wk.data(), w.wv.data(),
                                    w.wo.data(), nullptr, nullptr, nullptr, w.bo.data(), &mha),
              HEADSUM_OK)
        << headsum_last_error();
    headsum_mha_free(mha);
    mha = nullptr;
    ASSERT_EQ(headsum_mha_create_shard_ex(&config, opt, 2, 4, w.wq.data(), w.wk.data(),
                                          w.wv.data(), w.wo.data(), nullptr, nullptr, nullptr,
                                          nullptr, &mha),
              HEADSUM_OK)
        << headsum_last_error();
    headsum_mha_free(mha);
  }
}

TEST(LayerInvalid, CacheCreateAndForwardRejectBadInputsAndWriteNothing) {
  const Weights w;
  const headsum_mha_config config = GoodConfig();
  headsum_mha *mha = nullptr, *other = nullptr;
  ASSERT_EQ(headsum_mha_create(&config, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                               nullptr, nullptr, nullptr, nullptr, &mha),
            HEADSUM_OK);
  ASSERT_EQ(headsum_mha_create(&config, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                               nullptr, nullptr, nullptr, nullptr, &other),
            HEADSUM_OK);
  headsum_kv_cache* cache = kUntouchedCache;
  ExpectInvalid("cache mha NULL", headsum_kv_cache_create(nullptr, 1, 8, &cache), {"mha"});
  ExpectInvalid("batch 0", headsum_kv_cache_create(mha, 0, 8, &cache), {"batch = 0"});
  ExpectInvalid("capacity -3", headsum_kv_cache_create(mha, 1, -3, &cache),
                {"capacity = -3"});
  ExpectInvalid("capacity overflows", headsum_kv_cache_create(mha, 1, int64_t{1} << 62, &cache),
                {"capacity"});
  ExpectInvalid("cache NULL", headsum_kv_cache_create(mha, 1, 8, nullptr), {"cache"});
  EXPECT_EQ(cache, kUntouchedCache);

  ASSERT_EQ(headsum_kv_cache_create(mha, 2, 8, &cache), HEADSUM_OK);
  const std::vector<float> x = RandomUniform(2 * 3 * kDm, -1, 1, 9);
  std::vector<float> y = Sentinels(x.size());
  ExpectInvalid("forward mha NULL", headsum_mha_forward(nullptr, cache, 2, 3, x.data(), y.data()),
                {"mha"});
  ExpectInvalid("seq 0", headsum_mha_forward(mha, cache, 2, 0, x.data(), y.data()),
                {"seq = 0"});
  ExpectInvalid("batch -1", headsum_mha_forward(mha, cache, -1, 3, x.data(), y.data()),
                {"batch = -1"});
  ExpectInvalid("x NULL", headsum_mha_forward(mha, cache, 2, 3, nullptr, y.data()), {"x"});
  ExpectInvalid("y NULL", headsum_mha_forward(mha, cache, 2, 3, x.data(), nullptr), {"y"});
  ExpectInvalid("batch other than the cache's",
                headsum_mha_forward(mha, cache, 1, 3, x.data(), y.data()),
                {"batch = 1", "cache's batch (2)"});
  ExpectInvalid("cache of another layer",
                headsum_mha_forward(other, cache, 2, 3, x.data(), y.data()),
                {"cache", "another layer"});
  ExpectInvalid("seq overflows x", headsum_mha_forward(mha, nullptr, 2, int64_t{1} << 61,
                                                       x.data(), y.data()),
                {"2305843009213693952"});  // seq's value, in the tensor that overflows
  EXPECT_EQ(y, Sentinels(x.size()));
  EXPECT_EQ(headsum_kv_cache_length(cache), 0);
  // The cache is still good after all that.
  ASSERT_EQ(headsum_mha_forward(mha, cache, 2, 3, x.data(), y.data()), HEADSUM_OK)
      << headsum_last_error();
  EXPECT_EQ(headsum_kv_cache_length(cache), 3);
  headsum_kv_cache_free(cache);
  headsum_mha_free(other);
  headsum_mha_free(mha);
  headsum_mha_free(nullptr);
  headsum_kv_cache_free(nullptr);
}

// The C++ face: the same calls, exceptions for failures, views checked
// against the config, caches that free themselves.
TEST(LayerCpp, MhaAndKvCacheWrapTheCalls) {
  const Weights w;
  headsum::MhaConfig config;
  config.model_dim = kDm;
  config.heads = kH;
  config.kv_heads = kHkv;
  config.head_dim = kL;
  config.rope_theta = 10000.0f;
  headsum::MhaWeights weights;
  weights.wq = w.wq;
  weights.wk = w.wk;
  weights.wv = w.wv;
  weights.wo = w.wo;
  weights.bo = w.bo;
  const headsum::Mha mha(config, weights);
  headsum::KvCache cache = mha.new_cache(1, 5);
  EXPECT_EQ(cache.capacity(), 5);
  EXPECT_EQ(cache.batch(), 1);
  const std::vector<float> x = RandomUniform(5 * kDm, -1, 1, 11);
  std::vector<float> y_steps(x.size()), y_all(x.size());
  mha.forward(cache, 1, 3, headsum::In(x.data(), 3 * kDm), headsum::Out(y_steps.data(), 3 * kDm));
  mha.forward(cache, 1, 2, headsum::In(x.data() + 3 * kDm, 2 * kDm),
              headsum::Out(y_steps.data() + 3 * kDm, 2 * kDm));
  EXPECT_EQ(cache.length(), 5);
  try {
    mha.forward(cache, 1, 1, headsum::In(x.data(), kDm), headsum::Out(y_all.data(), kDm));
    ADD_FAILURE() << "an overflowing forward did not throw";
  } catch (const headsum::Error& e) {
    EXPECT_EQ(e.status(), HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
  }
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  // A view shorter than the shape needs is refused before any call.
  EXPECT_THROW(mha.forward(1, 5, headsum::In(x.data(), 4 * kDm), y_all), headsum::Error);
  // Without a cache: bitwise what the C call gives.
  mha.forward(1, 5, x, y_all);
  std::vector<float> y_c(x.size());
  ASSERT_EQ(headsum_mha_forward(mha.get(), nullptr, 1, 5, x.data(), y_c.data()), HEADSUM_OK);
  EXPECT_TRUE(BitwiseEqual(y_all, y_c, Layout{{1, 5, kDm}, "bsd"}));
  headsum::KvCache moved = std::move(cache);
  EXPECT_EQ(moved.capacity(), 5);
  const headsum::Mha shard = headsum::Mha::shard(config, 0, 2, weights);
  EXPECT_NE(shard.get(), nullptr);
  EXPECT_THROW(headsum::Mha::shard(config, 1, 2, weights), headsum::Error);
}

// The C++ face of the layer with options: Mha(config, options, weights) is
// bitwise headsum_mha_create_ex's layer; short slopes or sinks, a bias and
// every C rule throw headsum::Error with the status.
TEST(LayerCpp, MhaWithOptionsWrapsCreateEx) {
  const Weights w;
  headsum::MhaConfig config;
  config.model_dim = kDm;
  config.heads = kH;
  config.kv_heads = kHkv;
  config.head_dim = kL;
  config.rope_theta = 10000.0f;
  headsum::MhaWeights weights;
  weights.wq = w.wq;
  weights.wk = w.wk;
  weights.wv = w.wv;
  weights.wo = w.wo;
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks = {0.0f, 1.0f, -1.0f, 2.0f};
  headsum::AttnOptions options;
  options.window = 3;
  options.softcap = 2.0f;
  options.alibi_slopes = slopes;
  options.sinks = sinks;
  const headsum::Mha mha(config, options, weights);
  const std::vector<float> x = RandomUniform(5 * kDm, -1, 1, 12);
  std::vector<float> y(x.size()), y_c(x.size());
  mha.forward(1, 5, x, y);
  const headsum_mha_config c = config.c();
  const headsum_attn_options c_opt = {3, 2.0f, slopes.data(), sinks.data(), nullptr};
  headsum_mha* made = nullptr;
  ASSERT_EQ(headsum_mha_create_ex(&c, &c_opt, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                                  nullptr, nullptr, nullptr, nullptr, &made),
            HEADSUM_OK);
  ASSERT_EQ(headsum_mha_forward(made, nullptr, 1, 5, x.data(), y_c.data()), HEADSUM_OK);
  headsum_mha_free(made);
  EXPECT_TRUE(BitwiseEqual(y, y_c, Layout{{1, 5, kDm}, "bsd"}));
  // A shard takes the whole layer's slopes and sinks.
  const headsum::Mha shard = headsum::Mha::shard(config, options, 2, 4, weights);
  EXPECT_NE(shard.get(), nullptr);
  auto throws = [&](const char* what, const headsum::AttnOptions& bad, const char* mention) {
    SCOPED_TRACE(what);
    try {
      const headsum::Mha m(config, bad, weights);
      ADD_FAILURE() << "did not throw";
    } catch (const headsum::Error& e) {
      EXPECT_EQ(e.status(), HEADSUM_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  headsum::AttnOptions short_slopes = options;
  short_slopes.alibi_slopes = headsum::In(slopes.data(), 3);
  throws("3 slopes of 4 heads", short_slopes, "alibi_slopes");
  headsum::AttnOptions short_sinks = options;
  short_sinks.sinks = headsum::In(sinks.data(), 2);
  throws("2 sinks of 4 heads", short_sinks, "sinks");
  headsum::AttnOptions negative = options;
  negative.window = -4;
  throws("window -4", negative, "options->window = -4");
  std::vector<float> bias_data(25, 0.0f);
  headsum::AttnOptions with_bias = options;
  with_bias.bias =
      headsum::AttnBias::of(headsum::Tensor<const float>::bhsd(bias_data.data(), 1, 1, 5, 5));
  throws("a bias", with_bias, "options->bias");
}

}  // namespace
}  // namespace headsum_test
