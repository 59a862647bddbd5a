// IEEE special values and extreme magnitudes, on every compiled target.
//
// The contract is the arithmetic the API documents, carried out in IEEE
// semantics:
//  - a NaN in one input element reaches exactly the outputs that depend on it
//    (and no other output changes: those stay within the usual bound of the
//    reference computed without the NaN);
//  - softmax_v: a -inf score gets weight 0; a +inf score makes its row
//    exp(inf - inf) = NaN (what the double reference gives); a row with every
//    entry masked gives exact zeros;
//  - logits of 1e4 .. 1e6 (and finite scores of any size) give finite outputs
//    equal to the (one-hot-ish) reference softmax;
//  - a sum of large head contributions (1e37 each, alternating signs) does not
//    overflow where the double reference is a finite float, and neither do
//    the norms of large contributions (nor do small ones underflow to 0).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

testing::AssertionResult CallFailed(const char* fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

// Attention shapes: GQA causal with Sq < Skv; MQA causal with Sq > Skv (fully
// masked rows); long rows over several key tiles; decode with >= 1024 keys
// (keys split in 512s, partials merged); the seed.
std::vector<MhaShape> AttnShapes() {
  return {
      MhaShape{2, 4, 2, 17, 65, 16, 33, true},
      MhaShape{1, 2, 1, 65, 17, 7, 17, true},
      MhaShape{1, 3, 0, 3, 130, 80, 96, false},
      MhaShape{1, 2, 1, 1, 1025, 16, 5, false},
      headsum_shapes::SeedShape(true),
  };
}

std::vector<MhaShape> ProjShapes() {
  return {
      MhaShape{2, 4, 4, 7, 7, 5, 19, false},
      MhaShape{1, 8, 8, 49, 49, 16, 129, false},
      headsum_shapes::SeedShape(false),
  };
}

bool Sees(const MhaShape& s, int64_t i, int64_t j) {
  return !s.causal || j <= i + (s.seq_kv - s.seq_q);
}
bool SeesAnyKey(const MhaShape& s, int64_t i) { return Sees(s, i, 0); }
int64_t KvHeadOf(const MhaShape& s, int64_t h) { return h / (s.heads / s.resolved_kv_heads()); }

size_t QAt(const MhaShape& s, int64_t b, int64_t h, int64_t i, int64_t l) {
  return size_t(((b * s.heads + h) * s.seq_q + i) * s.head_dim + l);
}
size_t KvAt(const MhaShape& s, int64_t b, int64_t g, int64_t j, int64_t l) {
  return size_t(((b * s.resolved_kv_heads() + g) * s.seq_kv + j) * s.head_dim + l);
}
size_t SAt(const MhaShape& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  return size_t(((b * s.heads + h) * s.seq_q + i) * s.seq_kv + j);
}

// `actual` is NaN exactly where `nan_at` says; every other element is within
// `bound` of `clean_ref` (the reference for the inputs without the NaN, which
// those elements do not depend on).
testing::AssertionResult NaNExactlyWhere(const std::vector<float>& actual,
                                         const std::vector<char>& nan_at,
                                         std::vector<double> clean_ref,
                                         std::vector<double> clean_bound,
                                         const Layout& layout) {
  constexpr int kMaxReported = 6;
  size_t expected_nans = 0, missing = 0, unexpected = 0;
  std::ostringstream report;
  report.precision(9);
  std::vector<float> rest = actual;
  for (size_t n = 0; n < actual.size(); ++n) {
    if (nan_at[n]) {
      ++expected_nans;
      if (!std::isnan(actual[n])) {
        if (missing < kMaxReported) {
          report << "\n  at " << layout.Index(n) << ": depends on the NaN, but is "
                 << actual[n];
        }
        ++missing;
      }
      rest[n] = 0.0f;
      clean_ref[n] = 0.0;
      clean_bound[n] = 0.0;
    } else if (std::isnan(actual[n])) {
      if (unexpected < kMaxReported) {
        report << "\n  at " << layout.Index(n) << ": does not depend on the NaN, but is NaN";
      }
      ++unexpected;
      rest[n] = float(clean_ref[n]);  // counted here, not again below
    }
  }
  const testing::AssertionResult others = AllWithinBound(clean_ref, clean_bound, rest, layout);
  if (missing == 0 && unexpected == 0 && others) return testing::AssertionSuccess();
  testing::AssertionResult r = testing::AssertionFailure();
  r << missing << " of the " << expected_nans
    << " elements that depend on the NaN are not NaN; " << unexpected << " of the "
    << actual.size() - expected_nans << " others are NaN" << report.str();
  if (!others) r << "\n  the others vs the reference: " << others.message();
  return r;
}

// ---- attention: NaN in K, Q, V and the scores ------------------------------------------

struct AttnInputs {
  // q, k in [-magnitude, magnitude), v in [-1, 1).
  AttnInputs(const MhaShape& s, uint64_t seed, float magnitude = 1.0f)
      : q(RandomUniform(s.q_elems(), -magnitude, magnitude, 8 * seed + 1)),
        k(RandomUniform(s.kv_elems(), -magnitude, magnitude, 8 * seed + 2)),
        v(RandomUniform(s.kv_elems(), -1, 1, 8 * seed + 3)) {}
  std::vector<float> q, k, v;
};

struct AttnOutputs {
  headsum_status status = HEADSUM_OK;
  const char* failed = "";
  std::vector<float> scores, composed, fused;  // qk_scores, softmax_v(scores), attention
};

AttnOutputs RunAttention(const MhaShape& s, const AttnInputs& in, float scale = 0.0f) {
  const headsum_attn_shape a = s.attn(scale);
  AttnOutputs o;
  o.scores = Sentinels(s.scores_elems());
  o.composed = Sentinels(s.out_elems());
  o.fused = Sentinels(s.out_elems());
  o.status = headsum_qk_scores(&a, in.q.data(), in.k.data(), o.scores.data());
  if (o.status != HEADSUM_OK) return o.failed = "qk_scores", o;
  o.status = headsum_softmax_v(&a, o.scores.data(), in.v.data(), o.composed.data());
  if (o.status != HEADSUM_OK) return o.failed = "softmax_v", o;
  o.status = headsum_attention(&a, in.q.data(), in.k.data(), in.v.data(), o.fused.data());
  if (o.status != HEADSUM_OK) return o.failed = "attention", o;
  return o;
}

// Which NaNs each output must hold, per kind of poisoned input element.
struct AttnNaNMasks {
  std::vector<char> scores, out;
};

// Checks qk_scores, softmax_v(qk_scores) and attention with `poisoned`
// inputs against the masks; the clean reference covers everything else.
testing::AssertionResult CheckAttentionNaNs(const MhaShape& s, const AttnInputs& clean,
                                            const AttnInputs& poisoned,
                                            const AttnNaNMasks& masks) {
  const AttnOutputs o = RunAttention(s, poisoned);
  if (o.status != HEADSUM_OK) return CallFailed(o.failed, o.status);
  const headsum_attn_shape a = s.attn();
  const RefAttnDims d(a);
  const std::vector<double> ref = RefAttention(d, clean.q.data(), clean.k.data(), clean.v.data());
  const std::vector<double> bound =
      AttentionBound(d, clean.q.data(), clean.k.data(), clean.v.data());
  // softmax_v reads f32 scores: twice the attention bound covers its own
  // error on top of the scores' (as in attention_test's composed check).
  std::vector<double> bound2 = bound;
  for (double& x : bound2) x *= 2;
  const testing::AssertionResult results[] = {
      NaNExactlyWhere(o.scores, masks.scores, RefQkScores(d, clean.q.data(), clean.k.data()),
                      QkScoresBound(d, clean.q.data(), clean.k.data()), ScoresLayout(s)),
      NaNExactlyWhere(o.composed, masks.out, ref, bound2, HeadsLayout(s)),
      NaNExactlyWhere(o.fused, masks.out, ref, bound, HeadsLayout(s)),
  };
  const char* names[] = {"qk_scores", "softmax_v(qk_scores)", "attention"};
  bool ok = true;
  testing::AssertionResult all = testing::AssertionSuccess();
  for (int n = 0; n < 3; ++n) {
    if (results[n]) continue;
    if (ok) all = testing::AssertionFailure();
    ok = false;
    all << "\n" << names[n] << ": " << results[n].message();
  }
  return all;
}

class Numerics : public TargetTest {};

// K[b][g][j][l0] = NaN: every score S[b][h][i][j] of a query head h of group
// g that sees key j is NaN (masked ones stay -inf), so exactly those query
// rows of O are NaN, all L values; every other row is finite and unchanged.
TEST_P(Numerics, NaNInKeyRowMakesExactlyTheQueryRowsThatSeeItNaN) {
  const std::vector<MhaShape> shapes = AttnShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const AttnInputs clean(s, n);
    const int64_t b = s.batch - 1, g = s.resolved_kv_heads() - 1, l0 = s.head_dim / 2;
    for (const int64_t j : {int64_t{0}, s.seq_kv / 2, s.seq_kv - 1}) {
      AttnInputs poisoned = clean;
      poisoned.k[KvAt(s, b, g, j, l0)] = kNaN;
      AttnNaNMasks m{std::vector<char>(s.scores_elems(), 0), std::vector<char>(s.out_elems(), 0)};
      for (int64_t h = 0; h < s.heads; ++h) {
        if (KvHeadOf(s, h) != g) continue;
        for (int64_t i = 0; i < s.seq_q; ++i) {
          if (!Sees(s, i, j)) continue;
          m.scores[SAt(s, b, h, i, j)] = 1;
          for (int64_t l = 0; l < s.head_dim; ++l) m.out[QAt(s, b, h, i, l)] = 1;
        }
      }
      EXPECT_TRUE(CheckAttentionNaNs(s, clean, poisoned, m))
          << s.name() << ", K[b=" << b << "][g=" << g << "][j=" << j << "][l=" << l0
          << "] = NaN";
    }
  }
}

// Q[b][h][i][l0] = NaN: only row i of head h is NaN (its visible scores, all
// L outputs); a row that sees no key still gives exact zeros.
TEST_P(Numerics, NaNInQueryRowMakesOnlyThatRowNaN) {
  const std::vector<MhaShape> shapes = AttnShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const AttnInputs clean(s, 100 + n);
    const int64_t b = 0, h = s.heads - 1, l0 = s.head_dim - 1;
    for (const int64_t i : {int64_t{0}, s.seq_q / 2, s.seq_q - 1}) {
      AttnInputs poisoned = clean;
      poisoned.q[QAt(s, b, h, i, l0)] = kNaN;
      AttnNaNMasks m{std::vector<char>(s.scores_elems(), 0), std::vector<char>(s.out_elems(), 0)};
      for (int64_t j = 0; j < s.seq_kv; ++j) {
        if (Sees(s, i, j)) m.scores[SAt(s, b, h, i, j)] = 1;
      }
      if (SeesAnyKey(s, i)) {
        for (int64_t l = 0; l < s.head_dim; ++l) m.out[QAt(s, b, h, i, l)] = 1;
      }
      EXPECT_TRUE(CheckAttentionNaNs(s, clean, poisoned, m))
          << s.name() << ", Q[b=" << b << "][h=" << h << "][i=" << i << "][l=" << l0
          << "] = NaN" << (SeesAnyKey(s, i) ? "" : " (a row that sees no key)");
    }
  }
}

// V[b][g][j][l0] = NaN: O[b][h][i][l0] = sum_j p_ij V[j][l0] / sum_j p_ij is
// NaN for every query row of group g that sees key j (p_ij > 0 here), in
// column l0 only.
TEST_P(Numerics, NaNInValueMakesExactlyThatColumnOfTheRowsThatSeeItNaN) {
  const std::vector<MhaShape> shapes = AttnShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const AttnInputs clean(s, 200 + n);
    const int64_t b = s.batch - 1, g = 0, l0 = s.head_dim / 3;
    for (const int64_t j : {int64_t{0}, s.seq_kv - 1}) {
      AttnInputs poisoned = clean;
      poisoned.v[KvAt(s, b, g, j, l0)] = kNaN;
      AttnNaNMasks m{std::vector<char>(s.scores_elems(), 0), std::vector<char>(s.out_elems(), 0)};
      for (int64_t h = 0; h < s.heads; ++h) {
        if (KvHeadOf(s, h) != g) continue;
        for (int64_t i = 0; i < s.seq_q; ++i) {
          if (Sees(s, i, j)) m.out[QAt(s, b, h, i, l0)] = 1;
        }
      }
      EXPECT_TRUE(CheckAttentionNaNs(s, clean, poisoned, m))
          << s.name() << ", V[b=" << b << "][g=" << g << "][j=" << j << "][l=" << l0
          << "] = NaN";
    }
  }
}

// softmax_v given scores: a NaN or +inf at a visible entry makes its row NaN
// (+inf: the row max is +inf and exp(inf - inf) = NaN, as in the IEEE double
// reference); a -inf entry gets weight 0; a row of -inf gives exact zeros.
// Other rows are unchanged.
TEST_P(Numerics, SoftmaxVNaNAndPlusInfScoresMakeTheirRowNaNMinusInfGetsZeroWeight) {
  const std::vector<MhaShape> shapes = AttnShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const headsum_attn_shape a = s.attn();
    const RefAttnDims d(a);
    const std::vector<float> v = RandomUniform(s.kv_elems(), -1, 1, 300 + n);
    std::vector<float> clean = RandomUniform(s.scores_elems(), -4, 4, 400 + n);
    for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        for (int64_t j = 0; j < s.seq_kv; ++j) {
          if (!Sees(s, i, j)) clean[size_t((bh * s.seq_q + i) * s.seq_kv + j)] = -kInf;
        }
      }
    }
    // -inf in some visible entries and in every visible entry of some rows:
    // part of the clean input (the reference gives them weight 0).
    const std::vector<float> coin = RandomUniform(clean.size(), 0, 1, 500 + n);
    for (size_t e = 0; e < clean.size(); ++e) {
      if (coin[e] < 0.25f) clean[e] = -kInf;
    }
    const int64_t rows = s.batch * s.heads * s.seq_q;
    for (int64_t row = 1; row < rows; row += 5) {
      for (int64_t j = 0; j < s.seq_kv; ++j) clean[size_t(row * s.seq_kv + j)] = -kInf;
    }
    const std::vector<double> ref = RefSoftmaxV(d, clean.data(), v.data());
    const std::vector<double> bound = SoftmaxVBound(d, clean.data(), v.data());

    for (const float special : {kNaN, kInf}) {
      // Poison one visible entry in every third row (rows 0, 3, 6, ...; the
      // all -inf rows are 1, 6, 11, ...: row 6 mixes both).
      std::vector<float> scores = clean;
      std::vector<char> nan_at(s.out_elems(), 0);
      for (int64_t row = 0; row < rows; row += 3) {
        const int64_t i = row % s.seq_q;
        if (!SeesAnyKey(s, i)) continue;
        const int64_t last_visible =
            s.causal ? std::min(s.seq_kv - 1, i + (s.seq_kv - s.seq_q)) : s.seq_kv - 1;
        const int64_t j = (row / 3) % (last_visible + 1);
        scores[size_t(row * s.seq_kv + j)] = special;
        for (int64_t l = 0; l < s.head_dim; ++l) nan_at[size_t(row * s.head_dim + l)] = 1;
      }
      std::vector<float> out = Sentinels(s.out_elems());
      const headsum_status st = headsum_softmax_v(&a, scores.data(), v.data(), out.data());
      ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
      EXPECT_TRUE(NaNExactlyWhere(out, nan_at, ref, bound, HeadsLayout(s)))
          << s.name() << ", one score per third row = " << special;
    }
  }
}

// Rows that see no key: causally (Sq > Skv) in all three kernels, and rows
// whose every score is -inf in softmax_v, give exact zeros, whatever the
// values hold.
TEST_P(Numerics, FullyMaskedRowsGiveExactZeros) {
  const MhaShape s{2, 4, 2, 65, 17, 16, 1, true};
  const AttnInputs in(s, 600);
  const AttnOutputs o = RunAttention(s, in);
  ASSERT_EQ(o.status, HEADSUM_OK) << o.failed << ": " << headsum_last_error();
  size_t rows_checked = 0;
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      if (SeesAnyKey(s, i)) continue;
      ++rows_checked;
      for (int64_t j = 0; j < s.seq_kv; ++j) {
        const float x = o.scores[size_t((bh * s.seq_q + i) * s.seq_kv + j)];
        EXPECT_EQ(x, -kInf) << "qk_scores [bh=" << bh << "][i=" << i << "][j=" << j << "]";
      }
      for (int64_t l = 0; l < s.head_dim; ++l) {
        const size_t at = size_t((bh * s.seq_q + i) * s.head_dim + l);
        EXPECT_EQ(o.composed[at], 0.0f) << "softmax_v [bh=" << bh << "][i=" << i << "]";
        EXPECT_EQ(o.fused[at], 0.0f) << "attention [bh=" << bh << "][i=" << i << "]";
      }
    }
  }
  EXPECT_EQ(rows_checked, size_t(s.batch * s.heads * (s.seq_q - s.seq_kv)));

  // softmax_v, full attention, every score of every other row -inf.
  const MhaShape f{1, 2, 1, 9, 130, 7, 1, false};
  const headsum_attn_shape fa = f.attn();
  std::vector<float> scores = RandomUniform(f.scores_elems(), -3, 3, 601);
  const std::vector<float> v = RandomUniform(f.kv_elems(), -1, 1, 602);
  for (int64_t row = 0; row < f.batch * f.heads * f.seq_q; row += 2) {
    for (int64_t j = 0; j < f.seq_kv; ++j) scores[size_t(row * f.seq_kv + j)] = -kInf;
  }
  std::vector<float> out = Sentinels(f.out_elems());
  ASSERT_EQ(headsum_softmax_v(&fa, scores.data(), v.data(), out.data()), HEADSUM_OK)
      << headsum_last_error();
  const RefAttnDims d(fa);
  EXPECT_TRUE(AllWithinBound(RefSoftmaxV(d, scores.data(), v.data()),
                             SoftmaxVBound(d, scores.data(), v.data()), out, HeadsLayout(f)));
  for (int64_t row = 0; row < f.batch * f.heads * f.seq_q; row += 2) {
    for (int64_t l = 0; l < f.head_dim; ++l) {
      EXPECT_EQ(out[size_t(row * f.head_dim + l)], 0.0f) << "row " << row << " of -inf";
    }
  }
}

// ---- extreme logits ---------------------------------------------------------------------

// Attention with scores of 1e4 .. 1e6: every output is finite; a row whose
// best key beats the runner-up by far more than the scores' f32 error is
// exactly that key's V row (the softmax is one-hot to far below f32
// resolution); the few other rows are within the (then loose) attention
// bound.  Checked for attention and for softmax_v(qk_scores).
testing::AssertionResult LargeLogitsMatchReference(const MhaShape& s, float scale,
                                                   float magnitude, uint64_t seed,
                                                   size_t* one_hot_rows, size_t* rows) {
  const AttnInputs in(s, seed, magnitude);
  const AttnOutputs o = RunAttention(s, in, scale);
  if (o.status != HEADSUM_OK) return CallFailed(o.failed, o.status);
  const RefAttnDims d(s.attn(scale));
  const std::vector<double> scores = RefQkScores(d, in.q.data(), in.k.data());
  const std::vector<double> score_bound = QkScoresBound(d, in.q.data(), in.k.data());
  std::vector<double> expected = RefAttention(d, in.q.data(), in.k.data(), in.v.data());
  std::vector<double> bound = AttentionBound(d, in.q.data(), in.k.data(), in.v.data());
  double largest = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = KvHeadOf(s, h);
      for (int64_t i = 0; i < s.seq_q; ++i) {
        ++*rows;
        int64_t best = -1;
        double m1 = -INFINITY, m2 = -INFINITY, err = 0;
        for (int64_t j = 0; j < s.seq_kv; ++j) {
          if (!Sees(s, i, j)) continue;
          const double x = scores[SAt(s, b, h, i, j)];
          largest = std::max(largest, std::fabs(x));
          err = std::max(err, score_bound[SAt(s, b, h, i, j)]);
          if (x > m1) {
            m2 = m1;
            m1 = x;
            best = j;
          } else if (x > m2) {
            m2 = x;
          }
        }
        // exp(-150) ~ 1e-65: every other key's weight is far below f32's
        // resolution even with the scores' error on both sides.
        if (best < 0 || m1 - m2 - 2 * err < 150) continue;
        ++*one_hot_rows;
        for (int64_t l = 0; l < s.head_dim; ++l) {
          const double x = in.v[KvAt(s, b, g, best, l)];
          expected[QAt(s, b, h, i, l)] = x;
          bound[QAt(s, b, h, i, l)] = 4 * kEps * std::fabs(x);
        }
      }
    }
  }
  if (largest < 1e4) {
    return testing::AssertionFailure() << "test setup: largest |score| " << largest
                                       << " < 1e4";
  }
  testing::AssertionResult r = AllWithinBound(expected, bound, o.fused, HeadsLayout(s));
  if (!r) {
    return testing::AssertionFailure() << "attention (|scores| up to " << largest
                                       << "): " << r.message();
  }
  r = AllWithinBound(expected, bound, o.composed, HeadsLayout(s));
  if (!r) {
    return testing::AssertionFailure() << "softmax_v(qk_scores) (|scores| up to " << largest
                                       << "): " << r.message();
  }
  return testing::AssertionSuccess();
}

TEST_P(Numerics, LogitsOf1e4To1e6StayFiniteAndMatchTheOneHotReference) {
  const std::vector<MhaShape> shapes = AttnShapes();
  size_t one_hot = 0, rows = 0;
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    // scale * q.k with q, k in [-1, 1): |q.k| up to ~L/3.
    EXPECT_TRUE(LargeLogitsMatchReference(s, 3e4f, 1.0f, 700 + n, &one_hot, &rows))
        << s.name() << ", scale 3e4";
    EXPECT_TRUE(LargeLogitsMatchReference(s, 1e6f, 1.0f, 710 + n, &one_hot, &rows))
        << s.name() << ", scale 1e6";
    // Large q and k, the default scale 1/sqrt(L).
    EXPECT_TRUE(LargeLogitsMatchReference(s, 0.0f, 300.0f, 720 + n, &one_hot, &rows))
        << s.name() << ", q, k in [-300, 300)";
  }
  // Most rows must be clear-cut, or the test checks little.
  EXPECT_GT(one_hot, rows / 2) << one_hot << " of " << rows << " rows one-hot";
}

// softmax_v given finite scores of any magnitude, up to +-FLT_MAX: finite
// outputs within the bound of the reference (s - max is formed in f32, so
// scores near FLT_MAX must not turn into inf - inf, nor (s - max) * log2(e)
// overflow to NaN).
TEST_P(Numerics, SoftmaxVOfHugeFiniteScoresIsFinite) {
  const std::vector<MhaShape> shapes = AttnShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const headsum_attn_shape a = s.attn();
    const RefAttnDims d(a);
    const std::vector<float> v = RandomUniform(s.kv_elems(), -1, 1, 800 + n);
    for (const float magnitude : {1e4f, 1e6f, 1e30f, FLT_MAX}) {
      std::vector<float> scores = RandomUniform(s.scores_elems(), -1, 1, 810 + n);
      for (float& x : scores) x = x * magnitude;  // [-1, 1) * FLT_MAX stays finite
      // A few rows of near ties at the top of the range.
      for (size_t row = 0; row < scores.size() / size_t(s.seq_kv); row += 7) {
        float* r = &scores[row * size_t(s.seq_kv)];
        for (int64_t j = 0; j < s.seq_kv; j += 2) {
          r[j] = magnitude * (j % 4 == 0 ? 1.0f : 0.999999f);
        }
      }
      std::vector<float> out = Sentinels(s.out_elems());
      ASSERT_EQ(headsum_softmax_v(&a, scores.data(), v.data(), out.data()), HEADSUM_OK)
          << headsum_last_error();
      EXPECT_TRUE(AllWithinBound(RefSoftmaxV(d, scores.data(), v.data()),
                                 SoftmaxVBound(d, scores.data(), v.data()), out, HeadsLayout(s)))
          << s.name() << ", scores in [-" << magnitude << ", " << magnitude << ")";
    }
  }
}

// ---- the projection family: NaN ---------------------------------------------------------

struct ProjInputs {
  ProjInputs(const MhaShape& s, uint64_t seed, int64_t n_directions)
      : heads(RandomUniform(s.out_elems(), -1, 1, 8 * seed + 1)),
        wo(RandomUniform(s.wo_elems(), -1, 1, 8 * seed + 2)),
        bias(RandomUniform(size_t(s.model_dim), -1, 1, 8 * seed + 3)),
        gates(RandomUniform(size_t(s.heads), 0.5f, 1.5f, 8 * seed + 4)),
        dirs(RandomUniform(size_t(n_directions * s.model_dim), -1, 1, 8 * seed + 5)),
        R(n_directions) {}
  std::vector<float> heads, wo, bias, gates, dirs;
  int64_t R;
};

// Every projection output for one set of inputs.
struct ProjOutputs {
  headsum_status status = HEADSUM_OK;
  const char* failed = "";
  std::vector<float> y, y_ex, per_head, attribution, attribution_basis, norms;
};

ProjOutputs RunProjection(const MhaShape& s, const ProjInputs& in) {
  const headsum_proj_shape p = s.proj();
  const size_t rows = size_t(s.batch * s.seq_q * s.heads);
  ProjOutputs o;
  o.y = Sentinels(s.y_elems());
  o.y_ex = Sentinels(s.y_elems());
  o.per_head = Sentinels(s.per_head_elems());
  o.attribution = Sentinels(rows * size_t(in.R));
  o.attribution_basis = Sentinels(rows * size_t(in.R));
  o.norms = Sentinels(rows);
  o.status = headsum_project_heads_sum(&p, in.heads.data(), in.wo.data(), in.bias.data(),
                                       o.y.data());
  if (o.status != HEADSUM_OK) return o.failed = "project_heads_sum", o;
  o.status = headsum_project_heads_sum_ex(&p, in.heads.data(), in.wo.data(), in.bias.data(),
                                          in.gates.data(), o.y_ex.data(), o.per_head.data());
  if (o.status != HEADSUM_OK) return o.failed = "project_heads_sum_ex", o;
  o.status = headsum_head_attribution(&p, in.heads.data(), in.wo.data(), in.dirs.data(), in.R,
                                      o.attribution.data());
  if (o.status != HEADSUM_OK) return o.failed = "head_attribution", o;
  headsum_attribution_basis* basis = nullptr;
  o.status = headsum_attribution_basis_create(&p, in.wo.data(), in.dirs.data(), in.R, &basis);
  if (o.status != HEADSUM_OK) return o.failed = "attribution_basis_create", o;
  o.status = headsum_head_attribution_basis(&p, in.heads.data(), basis,
                                            o.attribution_basis.data());
  headsum_attribution_basis_free(basis);
  if (o.status != HEADSUM_OK) return o.failed = "head_attribution_basis", o;
  o.status = headsum_head_contribution_norms(&p, in.heads.data(), in.wo.data(), o.norms.data());
  if (o.status != HEADSUM_OK) return o.failed = "head_contribution_norms", o;
  return o;
}

struct ProjNaNMasks {
  ProjNaNMasks(const MhaShape& s, int64_t R)
      : y(s.y_elems(), 0),
        y_ex(s.y_elems(), 0),
        per_head(s.per_head_elems(), 0),
        attribution(size_t(s.batch * s.seq_q * s.heads * R), 0),
        norms(size_t(s.batch * s.seq_q * s.heads), 0) {}
  std::vector<char> y, y_ex, per_head, attribution, norms;
};

testing::AssertionResult CheckProjectionNaNs(const MhaShape& s, const ProjInputs& clean,
                                             const ProjInputs& poisoned,
                                             const ProjNaNMasks& m) {
  const ProjOutputs o = RunProjection(s, poisoned);
  if (o.status != HEADSUM_OK) return CallFailed(o.failed, o.status);
  const RefProjDims d(s.proj());
  const std::vector<double> c = RefHeadContributions(d, clean.heads.data(), clean.wo.data());
  const std::vector<double> abs_c = AbsContributions(d, clean.heads.data(), clean.wo.data());
  struct Item {
    const char* name;
    const std::vector<float>& actual;
    const std::vector<char>& mask;
    std::vector<double> ref, bound;
    Layout layout;
  };
  const std::vector<double> attr = RefAttribution(d, c, clean.dirs.data(), clean.R);
  const std::vector<double> attr_bound =
      AttributionBound(d, clean.heads.data(), clean.wo.data(), clean.dirs.data(), clean.R);
  const Item items[] = {
      {"project_heads_sum", o.y, m.y, RefGatedSum(d, c, nullptr, clean.bias.data()),
       ProjectionBound(d, abs_c, nullptr, clean.bias.data()), YLayout(s)},
      {"project_heads_sum_ex y (gated)", o.y_ex, m.y_ex,
       RefGatedSum(d, c, clean.gates.data(), clean.bias.data()),
       ProjectionBound(d, abs_c, clean.gates.data(), clean.bias.data()), YLayout(s)},
      {"project_heads_sum_ex per_head", o.per_head, m.per_head, c, ContributionBound(d, abs_c),
       PerHeadLayout(s, s.model_dim, 'd')},
      {"head_attribution", o.attribution, m.attribution, attr, attr_bound,
       PerHeadLayout(s, clean.R, 'r')},
      {"head_attribution_basis", o.attribution_basis, m.attribution, attr, attr_bound,
       PerHeadLayout(s, clean.R, 'r')},
      {"head_contribution_norms", o.norms, m.norms, RefContributionNorms(d, c),
       ContributionNormsBound(d, c, abs_c), PerHeadLayout(s, 1, 'n')},
  };
  testing::AssertionResult all = testing::AssertionSuccess();
  bool ok = true;
  for (const Item& it : items) {
    const testing::AssertionResult r =
        NaNExactlyWhere(it.actual, it.mask, it.ref, it.bound, it.layout);
    if (!r) {
      if (ok) all = testing::AssertionFailure();
      ok = false;
      all << "\n" << it.name << ": " << r.message();
    }
  }
  return all;
}

size_t YAt(const MhaShape& s, int64_t b, int64_t t, int64_t col) {
  return size_t((b * s.seq_q + t) * s.model_dim + col);
}
size_t BshAt(const MhaShape& s, int64_t b, int64_t t, int64_t h) {
  return size_t((b * s.seq_q + t) * s.heads + h);
}

// O[b][h][t][l] = NaN: exactly Y[b][t][:] (plain and gated), per_head[b][t][h][:],
// attribution[b][t][h][:] and norms[b][t][h] are NaN.
TEST_P(Numerics, NaNInHeadOutputMakesExactlyItsTokensOutputsNaN) {
  const std::vector<MhaShape> shapes = ProjShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const ProjInputs clean(s, 900 + n, 3);
    const int64_t b = s.batch - 1, h = s.heads / 2;
    for (const int64_t t : {int64_t{0}, s.seq_q - 1}) {
      const int64_t l = (t * 7) % s.head_dim;
      ProjInputs poisoned = clean;
      poisoned.heads[QAt(s, b, h, t, l)] = kNaN;
      ProjNaNMasks m(s, clean.R);
      for (int64_t col = 0; col < s.model_dim; ++col) {
        m.y[YAt(s, b, t, col)] = m.y_ex[YAt(s, b, t, col)] = 1;
        m.per_head[BshAt(s, b, t, h) * size_t(s.model_dim) + size_t(col)] = 1;
      }
      for (int64_t r = 0; r < clean.R; ++r) {
        m.attribution[BshAt(s, b, t, h) * size_t(clean.R) + size_t(r)] = 1;
      }
      m.norms[BshAt(s, b, t, h)] = 1;
      EXPECT_TRUE(CheckProjectionNaNs(s, clean, poisoned, m))
          << s.name() << ", O[b=" << b << "][h=" << h << "][s=" << t << "][l=" << l
          << "] = NaN";
    }
  }
}

// Wo[h*L + l][col] = NaN: column col of every Y and of head h's per_head is
// NaN; head h's attribution (Wo[h] directions^T is NaN in row l, every r)
// and norms are NaN for every token.
TEST_P(Numerics, NaNInWeightMakesExactlyItsColumnAndHeadNaN) {
  const std::vector<MhaShape> shapes = ProjShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const ProjInputs clean(s, 950 + n, 2);
    const int64_t h = s.heads - 1, l = s.head_dim / 2, col = s.model_dim - 2;
    ProjInputs poisoned = clean;
    poisoned.wo[size_t((h * s.head_dim + l) * s.model_dim + col)] = kNaN;
    ProjNaNMasks m(s, clean.R);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq_q; ++t) {
        m.y[YAt(s, b, t, col)] = m.y_ex[YAt(s, b, t, col)] = 1;
        m.per_head[BshAt(s, b, t, h) * size_t(s.model_dim) + size_t(col)] = 1;
        for (int64_t r = 0; r < clean.R; ++r) {
          m.attribution[BshAt(s, b, t, h) * size_t(clean.R) + size_t(r)] = 1;
        }
        m.norms[BshAt(s, b, t, h)] = 1;
      }
    }
    EXPECT_TRUE(CheckProjectionNaNs(s, clean, poisoned, m))
        << s.name() << ", Wo[h=" << h << "][l=" << l << "][col=" << col << "] = NaN";
  }
}

// bias[col] = NaN: exactly column col of Y (plain and gated) is NaN.
// head_gates[h] = NaN: all of the gated Y is NaN (every element sums g_h c_h),
// nothing else (per_head is ungated).
// directions[r][col] = NaN: exactly attribution[..][r] is NaN.
TEST_P(Numerics, NaNInBiasGateOrDirectionReachesExactlyWhatUsesIt) {
  const MhaShape s = ProjShapes()[0];
  const ProjInputs clean(s, 990, 3);
  const int64_t col = 3, h = 1, r = 2;
  {
    ProjInputs poisoned = clean;
    poisoned.bias[size_t(col)] = kNaN;
    ProjNaNMasks m(s, clean.R);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq_q; ++t) m.y[YAt(s, b, t, col)] = m.y_ex[YAt(s, b, t, col)] = 1;
    }
    EXPECT_TRUE(CheckProjectionNaNs(s, clean, poisoned, m)) << "bias[" << col << "] = NaN";
  }
  {
    ProjInputs poisoned = clean;
    poisoned.gates[size_t(h)] = kNaN;
    ProjNaNMasks m(s, clean.R);
    for (char& x : m.y_ex) x = 1;
    EXPECT_TRUE(CheckProjectionNaNs(s, clean, poisoned, m)) << "head_gates[" << h << "] = NaN";
  }
  {
    ProjInputs poisoned = clean;
    poisoned.dirs[size_t(r * s.model_dim + col)] = kNaN;
    ProjNaNMasks m(s, clean.R);
    for (size_t row = 0; row < m.norms.size(); ++row) {
      m.attribution[row * size_t(clean.R) + size_t(r)] = 1;
    }
    EXPECT_TRUE(CheckProjectionNaNs(s, clean, poisoned, m))
        << "directions[" << r << "][" << col << "] = NaN";
  }
}

// ---- the projection family: large and small magnitudes ----------------------------------

// O ~ +-1e19 (sign alternating with the head), Wo ~ 1e18 / L: every head
// contribution is ~(0.25 .. 1) x 1e37 with the head's sign, bias ~ +-1e37.
// Every partial sum in any order stays below 1e38 < FLT_MAX, and so does the
// exact result.
ProjInputs LargeAlternatingInputs(const MhaShape& s, uint64_t seed) {
  ProjInputs in(s, seed, 2);
  const auto u = RandomUniform(in.heads.size(), 0.5f, 1.0f, seed + 11);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t t = 0; t < s.seq_q; ++t) {
        for (int64_t l = 0; l < s.head_dim; ++l) {
          const size_t at = QAt(s, b, h, t, l);
          in.heads[at] = (h % 2 == 0 ? 1e19f : -1e19f) * u[at];
        }
      }
    }
  }
  const auto w = RandomUniform(in.wo.size(), 0.5f, 1.0f, seed + 12);
  for (size_t e = 0; e < in.wo.size(); ++e) in.wo[e] = 1e18f / float(s.head_dim) * w[e];
  for (float& x : in.bias) x *= 1e37f;
  for (float& x : in.dirs) x /= float(s.model_dim);
  return in;
}

TEST_P(Numerics, SumOfLargeAlternatingHeadContributionsDoesNotOverflow) {
  const std::vector<MhaShape> shapes = ProjShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const ProjInputs in = LargeAlternatingInputs(s, 1000 + n);
    const ProjOutputs o = RunProjection(s, in);
    ASSERT_EQ(o.status, HEADSUM_OK) << o.failed << ": " << headsum_last_error();
    const RefProjDims d(s.proj());
    const std::vector<double> c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> y = RefGatedSum(d, c, nullptr, in.bias.data());
    for (double x : y) ASSERT_LT(std::fabs(x), 1e38) << "test setup";
    EXPECT_TRUE(AllWithinBound(y, ProjectionBound(d, abs_c, nullptr, in.bias.data()), o.y,
                               YLayout(s)))
        << s.name() << ": project_heads_sum";
    EXPECT_TRUE(AllWithinBound(RefGatedSum(d, c, in.gates.data(), in.bias.data()),
                               ProjectionBound(d, abs_c, in.gates.data(), in.bias.data()),
                               o.y_ex, YLayout(s)))
        << s.name() << ": project_heads_sum_ex y";
    EXPECT_TRUE(AllWithinBound(c, ContributionBound(d, abs_c), o.per_head,
                               PerHeadLayout(s, s.model_dim, 'd')))
        << s.name() << ": project_heads_sum_ex per_head";
    const std::vector<double> attr = RefAttribution(d, c, in.dirs.data(), in.R);
    const std::vector<double> attr_bound =
        AttributionBound(d, in.heads.data(), in.wo.data(), in.dirs.data(), in.R);
    EXPECT_TRUE(AllWithinBound(attr, attr_bound, o.attribution, PerHeadLayout(s, in.R, 'r')))
        << s.name() << ": head_attribution";
    EXPECT_TRUE(
        AllWithinBound(attr, attr_bound, o.attribution_basis, PerHeadLayout(s, in.R, 'r')))
        << s.name() << ": head_attribution_basis";
  }
}

// || c_h || for contributions of ~1e37 per element is ~1e37 sqrt(D), a
// finite float; a kernel that sums c^2 in f32 overflows (1e74) to inf.
TEST_P(Numerics, ContributionNormsOfLargeContributionsDoNotOverflow) {
  const std::vector<MhaShape> shapes = ProjShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    const ProjInputs in = LargeAlternatingInputs(s, 1100 + n);
    const ProjOutputs o = RunProjection(s, in);
    ASSERT_EQ(o.status, HEADSUM_OK) << o.failed << ": " << headsum_last_error();
    const RefProjDims d(s.proj());
    const std::vector<double> c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> norms = RefContributionNorms(d, c);
    for (double x : norms) ASSERT_LT(x, double(FLT_MAX)) << "test setup";
    EXPECT_TRUE(AllWithinBound(norms, ContributionNormsBound(d, c, abs_c), o.norms,
                               PerHeadLayout(s, 1, 'n')))
        << s.name() << ": head_contribution_norms of ~1e37 contributions";
  }
}

// Contributions of ~1e-25 per element: c^2 ~ 1e-50 is below the smallest
// f32 subnormal, the norm ~1e-25 sqrt(D) is a normal float.
TEST_P(Numerics, ContributionNormsOfTinyContributionsDoNotUnderflow) {
  const std::vector<MhaShape> shapes = ProjShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    const MhaShape& s = shapes[n];
    ProjInputs in(s, 1200 + n, 1);
    for (float& x : in.heads) x *= 1e-20f;
    for (float& x : in.wo) x *= 1e-5f / float(s.head_dim);
    const ProjOutputs o = RunProjection(s, in);
    ASSERT_EQ(o.status, HEADSUM_OK) << o.failed << ": " << headsum_last_error();
    const RefProjDims d(s.proj());
    const std::vector<double> c = RefHeadContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> abs_c = AbsContributions(d, in.heads.data(), in.wo.data());
    const std::vector<double> norms = RefContributionNorms(d, c);
    for (double x : norms) ASSERT_GT(x, double(FLT_MIN)) << "test setup";
    EXPECT_TRUE(AllWithinBound(norms, ContributionNormsBound(d, c, abs_c), o.norms,
                               PerHeadLayout(s, 1, 'n')))
        << s.name() << ": head_contribution_norms of ~1e-25 contributions";
  }
}

// The kernels' exponential (ExpNonPositive in kernels/matmul-inl.h) is
// documented as < 2 ulp relative error on [-87.3, 0].  softmax_v with two
// keys, scores {0, x} and V = I, gives out = {1, e^x} / (1 + e^x): the
// ratio out[1] / out[0] is the kernel's e^x, up to one rounding in each of
// the two normalizations.  So |ratio / e^x - 1| <= 2 ulp + 2 half-ulps.
TEST_P(Numerics, SoftmaxExponentialIsWithinTwoUlpDownToFltMin) {
  constexpr int64_t kRows = 1 << 16;
  headsum_attn_shape shape{};
  shape.batch = shape.heads = 1;
  shape.seq_q = kRows;
  shape.seq_kv = 2;
  shape.head_dim = 2;
  std::vector<float> scores(2 * kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    scores[2 * r] = 0.0f;
    scores[2 * r + 1] = -87.3f * float(r) / float(kRows - 1);  // 0 .. -87.3
  }
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> out = Sentinels(2 * kRows);
  ASSERT_EQ(headsum_softmax_v(&shape, scores.data(), v.data(), out.data()), HEADSUM_OK)
      << headsum_last_error();
  double worst = 0;
  float worst_x = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const double x = scores[2 * r + 1];
    const double rel = std::fabs(double(out[2 * r + 1]) / double(out[2 * r]) / std::exp(x) - 1.0);
    if (!(rel <= worst)) {
      worst = rel;
      worst_x = float(x);
    }
  }
  const double ulp = std::ldexp(1.0, -23);
  EXPECT_LE(worst, 3.0 * ulp) << "worst relative error " << worst / ulp << " ulp at x = " << worst_x;
  std::printf("[ EXP      ] %s: worst relative error of e^x on [-87.3, 0]: %.2f ulp (x = %g)\n",
              GetParam().c_str(), worst / ulp, worst_x);
}

// attention carries its scores in base 2 and exponentiates with
// Exp2NonPositive (kernels/matmul-inl.h), documented as < 2 ulp relative
// error on [-126, 0].  With scale = fl(ln 2) the kernel's base-2 scale
// fl(scale log2(e)) is exactly 1, so it exponentiates the query value itself:
// head_dim 2, K = {{0, 0}, {1, 0}}, V = I and a query row {x, 0} give scores
// {0, x} and out = {1, 2^x} / (1 + 2^x), and out[1] / out[0] is the kernel's
// 2^x up to one rounding in each normalization: <= 2 ulp + 2 half-ulps.
// Run on the block path (all rows in one head) and on the dot path (one row
// per batch entry, as in decode).
TEST_P(Numerics, AttentionExponentialIsWithinTwoUlpDownToFltMin) {
  constexpr int64_t kRows = 1 << 16;
  const float ln2 = 0.6931471805599453f;
  ASSERT_EQ(ln2 * 1.44269504088896341f, 1.0f) << "test setup: fl(fl(ln 2) log2(e)) == 1";
  for (const bool dot_path : {false, true}) {
    headsum_attn_shape shape{};
    shape.batch = dot_path ? kRows : 1;
    shape.heads = 1;
    shape.seq_q = dot_path ? 1 : kRows;
    shape.seq_kv = 2;
    shape.head_dim = 2;
    shape.scale = ln2;
    std::vector<float> q(2 * kRows), k, v;
    for (int64_t r = 0; r < kRows; ++r) {
      q[2 * r] = -126.0f * float(r) / float(kRows - 1);  // 0 .. -126
      q[2 * r + 1] = 0.0f;
    }
    const size_t kv_copies = dot_path ? size_t(kRows) : 1;
    for (size_t c = 0; c < kv_copies; ++c) {
      k.insert(k.end(), {0.0f, 0.0f, 1.0f, 0.0f});
      v.insert(v.end(), {1.0f, 0.0f, 0.0f, 1.0f});
    }
    std::vector<float> out = Sentinels(2 * kRows);
    ASSERT_EQ(headsum_attention(&shape, q.data(), k.data(), v.data(), out.data()), HEADSUM_OK)
        << headsum_last_error();
    double worst = 0;
    float worst_x = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const double x = q[2 * r];
      const double rel =
          std::fabs(double(out[2 * r + 1]) / double(out[2 * r]) / std::exp2(x) - 1.0);
      if (!(rel <= worst)) {
        worst = rel;
        worst_x = float(x);
      }
    }
    const char* path = dot_path ? "dot path" : "block path";
    const double ulp = std::ldexp(1.0, -23);
    EXPECT_LE(worst, 3.0 * ulp) << path << ": worst relative error " << worst / ulp
                                << " ulp at x = " << worst_x;
    std::printf("[ EXP2     ] %s, %s: worst relative error of 2^x on [-126, 0]: %.2f ulp (x = %g)\n",
                GetParam().c_str(), path, worst / ulp, worst_x);
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(Numerics);

}  // namespace
}  // namespace headsum_test
