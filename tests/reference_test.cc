// The reference checked by hand on tiny cases (it is what everything else
// is measured against), and the shape list checked for the coverage it
// promises.
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::MhaShape;

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

TEST(Reference, QkScoresAreScaledDotsWithBottomRightCausalMask) {
  // Sq = 2, Skv = 3: query i sees key j when j <= i + 1.
  const headsum_attn_shape shape = MhaShape{1, 1, 1, 2, 3, 2, 1, true}.attn(0.5f);
  const float q[] = {1, 2, 3, 4};
  const float k[] = {1, 0, 0, 1, 1, 1};
  const std::vector<double> s = RefQkScores(RefAttnDims(shape), q, k);
  const std::vector<double> want = {0.5, 1.0, kMinusInf, 1.5, 2.0, 3.5};
  EXPECT_EQ(s, want);
}

TEST(Reference, ScaleZeroMeansOneOverSqrtHeadDim) {
  EXPECT_DOUBLE_EQ(RefAttnDims(MhaShape{1, 1, 1, 1, 1, 4, 1, false}.attn()).scale, 0.5);
  EXPECT_DOUBLE_EQ(RefAttnDims(MhaShape{1, 1, 1, 1, 1, 64, 1, false}.attn(0.3f)).scale,
                   double(0.3f));
}

TEST(Reference, GroupedQueryHeadsShareKvHeadHOverGroup) {
  // H = 4, Hkv = 2: heads 0, 1 read kv head 0 (keys of 1s), heads 2, 3 kv head 1 (2s).
  const headsum_attn_shape shape = MhaShape{1, 4, 2, 1, 1, 3, 1, false}.attn(1.0f);
  const std::vector<float> q(12, 1.0f);
  const float k[] = {1, 1, 1, 2, 2, 2};
  EXPECT_EQ(RefQkScores(RefAttnDims(shape), q.data(), k), (std::vector<double>{3, 3, 6, 6}));
  // kv_heads = 0 means = heads.
  EXPECT_EQ(RefAttnDims(MhaShape{1, 4, 0, 1, 1, 3, 1, false}.attn()).kv_heads, 4);
}

TEST(Reference, SoftmaxVWeighsValuesByNormalizedExp) {
  // weights exp(0) : exp(ln 2) = 1 : 2, values 3 and 6: 1/3 * 3 + 2/3 * 6 = 5.
  const headsum_attn_shape shape = MhaShape{1, 1, 1, 1, 2, 1, 1, false}.attn();
  const float scores[] = {0.0f, float(std::log(2.0))};
  const float v[] = {3, 6};
  EXPECT_NEAR(RefSoftmaxV(RefAttnDims(shape), scores, v)[0], 5.0, 1e-7);
}

TEST(Reference, FullyMaskedRowsGiveZerosAndMaskedEntriesAreIgnored) {
  // Sq = 3 > Skv = 1, causal: rows 0 and 1 see nothing, row 2 sees key 0.
  const headsum_attn_shape shape = MhaShape{1, 1, 1, 3, 1, 2, 1, true}.attn();
  const float scores[] = {std::numeric_limits<float>::quiet_NaN(), 7.0f, 1.0f};
  const float v[] = {0.25f, -4.0f};
  EXPECT_EQ(RefSoftmaxV(RefAttnDims(shape), scores, v),
            (std::vector<double>{0, 0, 0, 0, 0.25, -4.0}));
}

TEST(Reference, ConcatThenGemmEqualsSumOfHeadContributions) {
  const MhaShape s{2, 3, 3, 5, 5, 4, 7, false};
  const headsum_proj_shape shape = s.proj();
  const RefProjDims d(shape);
  const auto heads = RandomUniform(s.out_elems(), -1, 1, 1);
  const auto wo = RandomUniform(s.wo_elems(), -1, 1, 2);
  const auto bias = RandomUniform(size_t(s.model_dim), -1, 1, 3);
  const auto concat = RefConcatProject(d, heads.data(), wo.data(), bias.data());
  const auto summed =
      RefGatedSum(d, RefHeadContributions(d, heads.data(), wo.data()), nullptr, bias.data());
  ASSERT_EQ(concat.size(), summed.size());
  for (size_t i = 0; i < concat.size(); ++i) EXPECT_NEAR(concat[i], summed[i], 1e-12) << i;
}

TEST(Reference, AttributionAndNormsOfAKnownContribution) {
  // One head, L = 1, D = 2: O = 2, Wo = [3, 4] -> c = [6, 8], ||c|| = 10.
  const headsum_proj_shape shape = {1, 1, 1, 1, 2};
  const RefProjDims d(shape);
  const float heads[] = {2}, wo[] = {3, 4}, dirs[] = {1, 0, 0.5f, -1};
  const auto c = RefHeadContributions(d, heads, wo);
  EXPECT_EQ(c, (std::vector<double>{6, 8}));
  EXPECT_EQ(RefAttribution(d, c, dirs, 2), (std::vector<double>{6, -5}));
  EXPECT_EQ(RefContributionNorms(d, c), (std::vector<double>{10}));
  const float gates[] = {0.5f};
  EXPECT_EQ(RefGatedSum(d, c, gates, nullptr), (std::vector<double>{3, 4}));
}

// ---- the shape list ----------------------------------------------------------------

TEST(Shapes, SweepStartsWithTheSeedAndCoversEverySeqPairBothWays) {
  const auto shapes = headsum_shapes::FullSweepShapes();
  ASSERT_GE(shapes.size(), 2u);
  EXPECT_EQ(shapes[0].name(), headsum_shapes::SeedShape(false).name());
  EXPECT_EQ(shapes[1].name(), headsum_shapes::SeedShape(true).name());
  EXPECT_EQ(shapes[0].name(), "B1_H8_Hkv8_Sq20_Skv20_L64_D512_full");
  std::set<std::tuple<int64_t, int64_t, bool>> pairs;
  for (const auto& s : shapes) pairs.insert({s.seq_q, s.seq_kv, s.causal});
  const size_t n_seq = headsum_shapes::kSeqLens().size();
  EXPECT_EQ(pairs.size(), n_seq * n_seq * 2);
  EXPECT_LE(shapes.size(), 300u) << "keep each kernel-target sweep to a few hundred shapes";
}

TEST(Shapes, EveryParameterValueAppearsSeveralTimes) {
  struct Sweep {
    const char* name;
    std::vector<MhaShape> shapes;
    bool has_causal;
  };
  for (const Sweep& sweep : {Sweep{"FullSweepShapes", headsum_shapes::FullSweepShapes(), true},
                             Sweep{"FullProjectionSweepShapes",
                                   headsum_shapes::FullProjectionSweepShapes(), false}}) {
    SCOPED_TRACE(sweep.name);
    const std::vector<MhaShape>& list = sweep.shapes;
    std::map<int64_t, int> batch, head_dim, model_dim, seq;
    std::map<std::pair<int64_t, int64_t>, int> head_config;
    int d_is_hl = 0, d_is_not_hl = 0, fully_masked = 0;
    for (const auto& s : list) {
      ++batch[s.batch];
      ++head_dim[s.head_dim];
      ++model_dim[s.model_dim];
      ++seq[s.seq_q];
      ++head_config[{s.heads, s.kv_heads}];
      ++(s.model_dim == s.heads * s.head_dim ? d_is_hl : d_is_not_hl);
      fully_masked += s.causal && s.seq_q > s.seq_kv;
      EXPECT_EQ(s.heads % s.resolved_kv_heads(), 0) << s.name();
    }
    const int kSeveral = 3;
    for (int64_t v : headsum_shapes::kBatches()) EXPECT_GE(batch[v], kSeveral) << "B=" << v;
    for (int64_t v : headsum_shapes::kHeadDims()) EXPECT_GE(head_dim[v], kSeveral) << "L=" << v;
    for (int64_t v : headsum_shapes::kSeqLens()) EXPECT_GE(seq[v], kSeveral) << "S=" << v;
    for (int64_t v : headsum_shapes::kModelDims()) {
      if (v != 0) {
        EXPECT_GE(model_dim[v], kSeveral) << "D=" << v;
      }
    }
    for (const auto& hc : headsum_shapes::kHeadConfigs()) {
      EXPECT_GE(head_config[hc], kSeveral) << "H=" << hc.first << " Hkv=" << hc.second;
    }
    EXPECT_GE(d_is_hl, kSeveral);
    EXPECT_GE(d_is_not_hl, kSeveral);
    if (sweep.has_causal) {
      EXPECT_GE(fully_masked, kSeveral);
    }
  }
}

TEST(Shapes, SmallSweepHasTheSeedAndFullyMaskedRows) {
  const auto small = headsum_shapes::SmallSweepShapes();
  int seed = 0, fully_masked = 0;
  for (const auto& s : small) {
    seed += s.name() == headsum_shapes::SeedShape(false).name();
    fully_masked += s.causal && s.seq_q > s.seq_kv;
  }
  EXPECT_EQ(seed, 1);
  EXPECT_GE(fully_masked, 2);
}

}  // namespace
}  // namespace headsum_test
