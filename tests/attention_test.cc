// qk_scores, softmax_v and attention on every compiled target, over the
// shape sweep, against the double-precision reference; the flash-style
// attention against its composed twin softmax_v(qk_scores); the masking
// promises (masked scores -inf, fully masked rows exactly 0); and the
// oneDNN-composed twins against the same reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "error_bounds.h"
#include "../dispatch/test_hooks.h"  // the streaming threshold
#include "headsum/headsum.h"
#include "reference.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using headsum_shapes::SmallSweepShapes;
using headsum_shapes::SweepShapes;

constexpr float kInf = std::numeric_limits<float>::infinity();

using QkFn = headsum_status (*)(const headsum_attn_shape*, const float*, const float*, float*);
using SoftmaxVFn = headsum_status (*)(const headsum_attn_shape*, const float*, const float*,
                                      float*);
using AttentionFn = headsum_status (*)(const headsum_attn_shape*, const float*, const float*,
                                       const float*, float*);

// Every third shape passes an explicit scale instead of 0 (= 1/sqrt(L)).
float ScaleFor(uint64_t n) { return n % 3 == 2 ? 0.37f : 0.0f; }

std::vector<MhaShape> EveryNth(const std::vector<MhaShape>& shapes, size_t n) {
  std::vector<MhaShape> out;
  for (size_t i = 0; i < shapes.size(); i += n) out.push_back(shapes[i]);
  return out;
}

// Causal shapes with Sq > Skv: their first Sq - Skv query rows see no key.
std::vector<MhaShape> ShapesWithFullyMaskedRows() {
  std::vector<MhaShape> out;
  for (const MhaShape& s : SweepShapes()) {
    if (s.causal && s.seq_q > s.seq_kv) out.push_back(s);
  }
  return out;
}

bool RowFullyMasked(const MhaShape& s, int64_t i) { return s.causal && i + (s.seq_kv - s.seq_q) < 0; }
bool Masked(const MhaShape& s, int64_t i, int64_t j) {
  return s.causal && j > i + (s.seq_kv - s.seq_q);
}

// Random scores in [-magnitude, magnitude) with `masked_fill` where the
// causal mask hides the entry (qk_scores writes -inf there).
std::vector<float> RandomScores(const MhaShape& s, float magnitude, uint64_t seed,
                                float masked_fill = -kInf) {
  std::vector<float> scores = RandomUniform(s.scores_elems(), -magnitude, magnitude, seed);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      for (int64_t j = 0; j < s.seq_kv; ++j) {
        if (Masked(s, i, j)) scores[size_t((bh * s.seq_q + i) * s.seq_kv + j)] = masked_fill;
      }
    }
  }
  return scores;
}

testing::AssertionResult CallFailed(const char* fn, headsum_status st) {
  return testing::AssertionFailure() << fn << " returned " << StatusName(st) << ": "
                                     << headsum_last_error();
}

// ---- qk_scores ---------------------------------------------------------------

testing::AssertionResult QkScoresMatchesReference(QkFn fn, const MhaShape& s, float scale,
                                                  float magnitude, uint64_t seed) {
  const headsum_attn_shape shape = s.attn(scale);
  const auto q = RandomUniform(s.q_elems(), -magnitude, magnitude, 4 * seed + 1);
  const auto k = RandomUniform(s.kv_elems(), -magnitude, magnitude, 4 * seed + 2);
  std::vector<float> scores = Sentinels(s.scores_elems());
  const headsum_status st = fn(&shape, q.data(), k.data(), scores.data());
  if (st != HEADSUM_OK) return CallFailed("qk_scores", st);
  const RefAttnDims d(shape);
  return AllWithinBound(RefQkScores(d, q.data(), k.data()), QkScoresBound(d, q.data(), k.data()),
                        scores, ScoresLayout(s));
}

// Every score tensor takes the non-temporal path (headsum::testing's
// streaming threshold at 0) while one of these lives.
struct StreamAllScores {
  StreamAllScores() { headsum::testing::SetStreamScoresBytes(0); }
  ~StreamAllScores() {
    headsum::testing::SetStreamScoresBytes(headsum::testing::kDefaultStreamScoresBytes);
  }
};

class QkScores : public TargetTest {};

TEST_P(QkScores, EqualsScaledQKTransposeWithMinusInfWhereMasked) {
  ForEachShape(SweepShapes(), [](const MhaShape& s, uint64_t n) {
    return QkScoresMatchesReference(headsum_qk_scores, s, ScaleFor(n), 1.0f, n);
  });
}

// q, k in [-2, 2] with scale 1: scores of several tens.
TEST_P(QkScores, LargeMagnitudesStayWithinBound) {
  ForEachShape(EveryNth(SweepShapes(), 3), [](const MhaShape& s, uint64_t n) {
    return QkScoresMatchesReference(headsum_qk_scores, s, 1.0f, 2.0f, 1000 + n);
  });
}

// Score tensors past headsum::testing's streaming threshold (64 MiB by
// default) are written with non-temporal stores; with the threshold at 0 the
// whole sweep takes that path.
TEST_P(QkScores, StreamedScoresEqualTheReference) {
  const StreamAllScores stream_all;
  ForEachShape(SweepShapes(), [](const MhaShape& s, uint64_t n) {
    return QkScoresMatchesReference(headsum_qk_scores, s, ScaleFor(n), 1.0f, 2000 + n);
  });
}

// Streamed scores written 0..15 floats past a 64-byte boundary: where Skv
// is a whole number of vectors, each row starts with the keys up to the
// next vector boundary and the rest stream aligned; elsewhere nothing
// changes.  Every placement gives the aligned placement's bits, and those
// are within the reference's bound.
TEST_P(QkScores, StreamedScoresAtEveryOffsetAreTheAlignedBits) {
  const StreamAllScores stream_all;
  const MhaShape shapes[] = {
      {1, 2, 1, 5, 64, 17, 34, false},  {1, 3, 3, 7, 48, 64, 192, true},
      {2, 2, 2, 3, 130, 8, 16, false},  {1, 1, 1, 9, 256, 63, 63, true},
      {1, 2, 2, 4, 17, 16, 32, false},  {1, 4, 2, 20, 20, 3, 12, true},
      {1, 1, 1, 65, 96, 1, 1, false}};
  uint64_t seed = 3000;
  for (const MhaShape& s : shapes) {
    ++seed;
    const headsum_attn_shape shape = s.attn();
    const auto q = RandomUniform(s.q_elems(), -1.0f, 1.0f, 4 * seed + 1);
    const auto k = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * seed + 2);
    const size_t n = s.scores_elems();
    std::vector<float> storage(n + 32);
    float* const base = reinterpret_cast<float*>(
        (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
    const std::vector<float> sentinels = Sentinels(n);
    std::vector<float> aligned;
    for (size_t off = 0; off < 16; ++off) {
      float* out = base + off;
      std::copy(sentinels.begin(), sentinels.end(), out);
      const headsum_status st = headsum_qk_scores(&shape, q.data(), k.data(), out);
      ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
      if (off == 0) {
        aligned.assign(out, out + n);
        const RefAttnDims d(shape);
        ASSERT_TRUE(AllWithinBound(RefQkScores(d, q.data(), k.data()),
                                   QkScoresBound(d, q.data(), k.data()), aligned,
                                   ScoresLayout(s)))
            << "Sq=" << s.seq_q << " Skv=" << s.seq_kv << " L=" << s.head_dim;
        continue;
      }
      ASSERT_EQ(std::memcmp(out, aligned.data(), n * sizeof(float)), 0)
          << "Sq=" << s.seq_q << " Skv=" << s.seq_kv << " L=" << s.head_dim
          << " causal=" << s.causal << ", " << off << " floats past a 64-byte boundary";
    }
  }
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(QkScores);

// ---- softmax_v ---------------------------------------------------------------

testing::AssertionResult SoftmaxVMatchesReference(SoftmaxVFn fn, const MhaShape& s,
                                                  const std::vector<float>& scores,
                                                  uint64_t seed) {
  const headsum_attn_shape shape = s.attn();
  const auto v = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * seed + 3);
  std::vector<float> out = Sentinels(s.out_elems());
  const headsum_status st = fn(&shape, scores.data(), v.data(), out.data());
  if (st != HEADSUM_OK) return CallFailed("softmax_v", st);
  const RefAttnDims d(shape);
  return AllWithinBound(RefSoftmaxV(d, scores.data(), v.data()),
                        SoftmaxVBound(d, scores.data(), v.data()), out, HeadsLayout(s));
}

class SoftmaxV : public TargetTest {};

TEST_P(SoftmaxV, EqualsSoftmaxAlongKeysTimesV) {
  ForEachShape(SweepShapes(), [](const MhaShape& s, uint64_t n) {
    return SoftmaxVMatchesReference(headsum_softmax_v, s, RandomScores(s, 4.0f, 4 * n), n);
  });
}

TEST_P(SoftmaxV, ScoresUpTo30StayWithinBound) {
  ForEachShape(EveryNth(SweepShapes(), 3), [](const MhaShape& s, uint64_t n) {
    return SoftmaxVMatchesReference(headsum_softmax_v, s, RandomScores(s, 30.0f, 4 * n + 7),
                                    2000 + n);
  });
}

// "entries masked by shape->causal are excluded whatever S holds": put NaN,
// +inf or a huge finite value where the mask hides the entry.
TEST_P(SoftmaxV, CausallyMaskedEntriesAreIgnoredWhateverTheyHold) {
  const float fills[] = {std::numeric_limits<float>::quiet_NaN(), kInf, 1e30f};
  std::vector<MhaShape> causal;
  for (const MhaShape& s : SweepShapes()) {
    if (s.causal) causal.push_back(s);
  }
  ForEachShape(EveryNth(causal, 2), [&](const MhaShape& s, uint64_t n) {
    return SoftmaxVMatchesReference(headsum_softmax_v, s,
                                    RandomScores(s, 4.0f, 4 * n + 9, fills[n % 3]), 3000 + n);
  });
}

// -inf scores (a caller's own mask) get weight 0; a row of -inf gives zeros.
TEST_P(SoftmaxV, MinusInfScoresGetZeroWeightAndAllMinusInfRowsGiveZeros) {
  std::vector<MhaShape> full;
  for (const MhaShape& s : SweepShapes()) {
    if (!s.causal && s.seq_kv > 1) full.push_back(s);
  }
  ForEachShape(EveryNth(full, 3), [](const MhaShape& s, uint64_t n) {
    std::vector<float> scores = RandomScores(s, 4.0f, 4 * n + 5);
    const auto coin = RandomUniform(scores.size(), 0.0f, 1.0f, 4 * n + 6);
    for (size_t e = 0; e < scores.size(); ++e) {
      if (coin[e] < 0.3f) scores[e] = -kInf;
    }
    for (int64_t row = 0; row < s.batch * s.heads * s.seq_q; row += 3) {
      for (int64_t j = 0; j < s.seq_kv; ++j) scores[size_t(row * s.seq_kv + j)] = -kInf;
    }
    return SoftmaxVMatchesReference(headsum_softmax_v, s, scores, 4000 + n);
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(SoftmaxV);

// ---- attention ---------------------------------------------------------------

testing::AssertionResult AttentionMatchesReference(AttentionFn fn, const MhaShape& s,
                                                   float scale, float magnitude,
                                                   uint64_t seed) {
  const headsum_attn_shape shape = s.attn(scale);
  const auto q = RandomUniform(s.q_elems(), -magnitude, magnitude, 4 * seed + 1);
  const auto k = RandomUniform(s.kv_elems(), -magnitude, magnitude, 4 * seed + 2);
  const auto v = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * seed + 3);
  std::vector<float> out = Sentinels(s.out_elems());
  const headsum_status st = fn(&shape, q.data(), k.data(), v.data(), out.data());
  if (st != HEADSUM_OK) return CallFailed("attention", st);
  const RefAttnDims d(shape);
  return AllWithinBound(RefAttention(d, q.data(), k.data(), v.data()),
                        AttentionBound(d, q.data(), k.data(), v.data()), out, HeadsLayout(s));
}

class Attention : public TargetTest {};

TEST_P(Attention, EqualsSoftmaxOfScaledQKTransposeTimesV) {
  ForEachShape(SweepShapes(), [](const MhaShape& s, uint64_t n) {
    return AttentionMatchesReference(headsum_attention, s, ScaleFor(n), 1.0f, n);
  });
}

TEST_P(Attention, LargeScoresStayWithinBound) {
  ForEachShape(EveryNth(SweepShapes(), 3), [](const MhaShape& s, uint64_t n) {
    return AttentionMatchesReference(headsum_attention, s, 1.0f, 2.0f, 5000 + n);
  });
}

// A few query rows (the dot-product path; 4-8 rows with the keys in the
// lanes, causal diagonal included) over more keys than the sweep has:
// several key tiles within a work item (rescaled partial sums), keys split
// across work items (Skv >= 1024; with GQA and MQA, batch 2, where the
// items run kv head by kv head), head dims that leave a vector and a lane
// tail.  Magnitude 2 makes the later tiles' maxima move far.
std::vector<MhaShape> FewRowsManyKeysShapes() {
  return {
      MhaShape{1, 2, 1, 1, 700, 65, 17, false},   MhaShape{2, 4, 2, 3, 1000, 17, 33, true},
      MhaShape{1, 3, 0, 2, 1600, 64, 96, false},  MhaShape{1, 1, 1, 1, 513, 1, 1, false},
      MhaShape{1, 2, 2, 3, 1100, 80, 160, true},  MhaShape{2, 8, 2, 1, 1100, 64, 64, true},
      MhaShape{2, 4, 1, 2, 2000, 17, 33, false}, MhaShape{1, 2, 2, 4, 300, 17, 33, true},
      MhaShape{1, 3, 1, 5, 700, 64, 20, true},    MhaShape{2, 2, 0, 8, 1030, 65, 7, true},
      // Head dims of 3, 6, 7 and 8 vectors on AVX-512, 3 and 4 on AVX2 (the
      // eight-key scoring holds up to 8 of q's vectors in registers, up to 4
      // on AVX2/SSE4, and loads them per row beyond that: L = 64 on AVX2).
      MhaShape{1, 2, 1, 1, 530, 48, 50, false},   MhaShape{1, 2, 2, 1, 410, 96, 70, true},
      MhaShape{1, 1, 0, 1, 390, 112, 9, false},   MhaShape{1, 2, 1, 1, 620, 128, 40, true},
      MhaShape{1, 2, 1, 1, 450, 26, 30, false},   MhaShape{1, 1, 1, 1, 333, 33, 8, true},
  };
}

TEST_P(Attention, FewQueryRowsOverManyKeysStayWithinBound) {
  ForEachShape(FewRowsManyKeysShapes(), [](const MhaShape& s, uint64_t n) {
    const testing::AssertionResult unit =
        AttentionMatchesReference(headsum_attention, s, ScaleFor(n), 1.0f, 7000 + n);
    if (!unit) return unit;
    return AttentionMatchesReference(headsum_attention, s, 1.0f, 2.0f, 7100 + n);
  });
}

// The same shapes with every K/V counted as read from memory: the one-row
// dot path then prefetches K/V rows ahead of the keys it scores (eight at a
// time, the rest one at a time), which the small shapes above never do.
TEST_P(Attention, FewQueryRowsOverManyKeysFromMemoryStayWithinBound) {
  struct RestoreThreshold {
    ~RestoreThreshold() {
      headsum::testing::SetKvInCacheBytes(headsum::testing::kKvInCacheAuto);
    }
  } restore;
  headsum::testing::SetKvInCacheBytes(0);
  ForEachShape(FewRowsManyKeysShapes(), [](const MhaShape& s, uint64_t n) {
    return AttentionMatchesReference(headsum_attention, s, 1.0f, 2.0f, 7200 + n);
  });
}

// The flash-style kernel against its simple twin on the same target: each is
// within AttentionBound of the exact result, so they are within twice that of
// each other.
TEST_P(Attention, EqualsSoftmaxVOfQkScores) {
  ForEachShape(EveryNth(SweepShapes(), 2), [](const MhaShape& s, uint64_t n) {
    const headsum_attn_shape shape = s.attn(ScaleFor(n));
    const auto q = RandomUniform(s.q_elems(), -1.0f, 1.0f, 4 * n + 1);
    const auto k = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * n + 2);
    const auto v = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * n + 3);
    std::vector<float> scores = Sentinels(s.scores_elems());
    std::vector<float> composed = Sentinels(s.out_elems());
    std::vector<float> fused = Sentinels(s.out_elems());
    headsum_status st = headsum_qk_scores(&shape, q.data(), k.data(), scores.data());
    if (st != HEADSUM_OK) return CallFailed("qk_scores", st);
    st = headsum_softmax_v(&shape, scores.data(), v.data(), composed.data());
    if (st != HEADSUM_OK) return CallFailed("softmax_v", st);
    st = headsum_attention(&shape, q.data(), k.data(), v.data(), fused.data());
    if (st != HEADSUM_OK) return CallFailed("attention", st);
    const RefAttnDims d(shape);
    std::vector<double> bound = AttentionBound(d, q.data(), k.data(), v.data());
    for (double& b : bound) b *= 2;
    return AllWithinBound(std::vector<double>(composed.begin(), composed.end()), bound, fused,
                          HeadsLayout(s));
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(Attention);

// ---- fully masked rows (causal, Sq > Skv) --------------------------------------

// Rows of a [B][H][Sq][X] tensor for which `pred(i)`; checks `ok(value)` on each.
template <class Pred, class Ok>
testing::AssertionResult CheckRows(const MhaShape& s, const std::vector<float>& t, int64_t width,
                                   const char* what, Pred pred, Ok ok) {
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      if (!pred(i)) continue;
      for (int64_t x = 0; x < width; ++x) {
        const float value = t[size_t((bh * s.seq_q + i) * width + x)];
        if (!ok(value)) {
          return testing::AssertionFailure()
                 << what << " at [bh=" << bh << "][i=" << i << "][" << x << "] is " << value;
        }
      }
    }
  }
  return testing::AssertionSuccess();
}

class FullyMaskedRows : public TargetTest {};

TEST_P(FullyMaskedRows, ScoresAreMinusInfAndOutputsExactlyZero) {
  ForEachShape(ShapesWithFullyMaskedRows(), [](const MhaShape& s, uint64_t n) {
    const headsum_attn_shape shape = s.attn();
    const auto q = RandomUniform(s.q_elems(), -1.0f, 1.0f, 4 * n + 1);
    const auto k = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * n + 2);
    const auto v = RandomUniform(s.kv_elems(), -1.0f, 1.0f, 4 * n + 3);
    std::vector<float> scores = Sentinels(s.scores_elems());
    std::vector<float> composed = Sentinels(s.out_elems());
    std::vector<float> fused = Sentinels(s.out_elems());
    headsum_status st = headsum_qk_scores(&shape, q.data(), k.data(), scores.data());
    if (st != HEADSUM_OK) return CallFailed("qk_scores", st);
    st = headsum_softmax_v(&shape, scores.data(), v.data(), composed.data());
    if (st != HEADSUM_OK) return CallFailed("softmax_v", st);
    st = headsum_attention(&shape, q.data(), k.data(), v.data(), fused.data());
    if (st != HEADSUM_OK) return CallFailed("attention", st);

    auto masked = [&](int64_t i) { return RowFullyMasked(s, i); };
    auto minus_inf = [](float x) { return x == -kInf; };
    auto zero = [](float x) { return x == 0.0f; };
    auto r = CheckRows(s, scores, s.seq_kv, "qk_scores", masked, minus_inf);
    if (!r) return r;
    r = CheckRows(s, composed, s.head_dim, "softmax_v", masked, zero);
    if (!r) return r;
    return CheckRows(s, fused, s.head_dim, "attention", masked, zero);
  });
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(FullyMaskedRows);

// ---- the oneDNN-composed twins -------------------------------------------------
// oneDNN picks its own ISA, so these run once rather than per target.

bool BuiltWithoutOnednn(headsum_status probe) { return probe == HEADSUM_ERR_UNSUPPORTED; }

headsum_status ProbeQk(QkFn fn) {
  const headsum_attn_shape shape = MhaShape{1, 1, 1, 1, 1, 1, 1, false}.attn();
  const float q = 1, k = 1;
  float s = 0;
  return fn(&shape, &q, &k, &s);
}

TEST(OnednnTwins, QkScoresOnednnEqualsReference) {
  if (BuiltWithoutOnednn(ProbeQk(headsum_qk_scores_onednn))) {
    GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
  }
  ForEachShape(SmallSweepShapes(), [](const MhaShape& s, uint64_t n) {
    return QkScoresMatchesReference(headsum_qk_scores_onednn, s, ScaleFor(n), 1.0f, 6000 + n);
  });
}

TEST(OnednnTwins, SoftmaxVOnednnEqualsReference) {
  if (BuiltWithoutOnednn(ProbeQk(headsum_softmax_v_onednn))) {
    GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
  }
  ForEachShape(SmallSweepShapes(), [](const MhaShape& s, uint64_t n) {
    return SoftmaxVMatchesReference(headsum_softmax_v_onednn, s,
                                    RandomScores(s, 4.0f, 4 * n + 7000), 7000 + n);
  });
}

TEST(OnednnTwins, AttentionOnednnEqualsReference) {
  const headsum_attn_shape shape = MhaShape{1, 1, 1, 1, 1, 1, 1, false}.attn();
  const float one = 1;
  float out = 0;
  if (BuiltWithoutOnednn(headsum_attention_onednn(&shape, &one, &one, &one, &out))) {
    GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
  }
  ForEachShape(SmallSweepShapes(), [](const MhaShape& s, uint64_t n) {
    return AttentionMatchesReference(headsum_attention_onednn, s, ScaleFor(n), 1.0f, 8000 + n);
  });
}

}  // namespace
}  // namespace headsum_test
