// The one list of multi-head attention shapes that the tests (and the
// benchmarks) sweep.  Header-only, depends only on the public C API.
//
// The seed shape is the article's: B=1, S=20, H=8, L=64, D=512.  The sweep
// covers every (Sq, Skv) pair of kSeqLens with causal off and on; the other
// parameters (batch, heads/kv_heads, head_dim, model_dim) are drawn from
// balanced, shuffled cycles so that every value of every parameter appears
// many times without the full Cartesian product.  Sizes sit just below, at
// and just above vector and tile edges (16, 64, 128 lanes of f32 ...).
#ifndef HEADSUM_TESTS_SHAPES_H_
#define HEADSUM_TESTS_SHAPES_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "headsum/headsum.h"

namespace headsum_shapes {

// One layer's dimensions.  Attention uses all but model_dim; the output
// projection uses batch, seq = seq_q, heads, head_dim and model_dim.
struct MhaShape {
  int64_t batch;
  int64_t heads;
  int64_t kv_heads;  // as passed to the API: 0 means = heads
  int64_t seq_q;
  int64_t seq_kv;
  int64_t head_dim;
  int64_t model_dim;
  bool causal;

  int64_t resolved_kv_heads() const { return kv_heads == 0 ? heads : kv_heads; }

  headsum_attn_shape attn(float scale = 0.0f) const {
    headsum_attn_shape s;
    s.batch = batch;
    s.heads = heads;
    s.kv_heads = kv_heads;
    s.seq_q = seq_q;
    s.seq_kv = seq_kv;
    s.head_dim = head_dim;
    s.scale = scale;
    s.causal = causal ? 1 : 0;
    return s;
  }
  headsum_proj_shape proj() const {
    headsum_proj_shape s;
    s.batch = batch;
    s.seq = seq_q;
    s.heads = heads;
    s.head_dim = head_dim;
    s.model_dim = model_dim;
    return s;
  }

  // Element counts of each tensor (see the layouts in headsum.h).
  size_t q_elems() const { return size_t(batch * heads * seq_q * head_dim); }
  size_t kv_elems() const { return size_t(batch * resolved_kv_heads() * seq_kv * head_dim); }
  size_t scores_elems() const { return size_t(batch * heads * seq_q * seq_kv); }
  size_t out_elems() const { return q_elems(); }  // O [B][H][Sq][L]
  size_t wo_elems() const { return size_t(heads * head_dim * model_dim); }
  size_t y_elems() const { return size_t(batch * seq_q * model_dim); }
  size_t per_head_elems() const { return size_t(batch * seq_q * heads * model_dim); }

  // "B1_H8_Hkv2_Sq20_Skv20_L64_D512_causal": readable in test logs and
  // usable as a benchmark label.
  std::string name() const {
    std::string s = "B" + std::to_string(batch) + "_H" + std::to_string(heads) + "_Hkv" +
                    std::to_string(kv_heads) + "_Sq" + std::to_string(seq_q) + "_Skv" +
                    std::to_string(seq_kv) + "_L" + std::to_string(head_dim) + "_D" +
                    std::to_string(model_dim);
    return s + (causal ? "_causal" : "_full");
  }
};

// Parameter values of the sweep.
inline const std::vector<int64_t>& kBatches() {
  static const std::vector<int64_t> v = {1, 2};
  return v;
}
// (heads, kv_heads): MHA (Hkv = H), GQA (H=8, Hkv=4 or 2), MQA (Hkv = 1) and
// kv_heads = 0 (means = heads).
inline const std::vector<std::pair<int64_t, int64_t>>& kHeadConfigs() {
  static const std::vector<std::pair<int64_t, int64_t>> v = {
      {1, 1}, {1, 0}, {2, 2}, {2, 1}, {2, 0}, {8, 8}, {8, 4}, {8, 2}, {8, 1}, {8, 0}};
  return v;
}
inline const std::vector<int64_t>& kSeqLens() {
  static const std::vector<int64_t> v = {1, 3, 17, 20, 63, 64, 65, 130};
  return v;
}
inline const std::vector<int64_t>& kHeadDims() {
  static const std::vector<int64_t> v = {1, 7, 16, 64, 80, 128};
  return v;
}
// 0 stands for D = H*L (the seed's case); the others make D != H*L.
inline const std::vector<int64_t>& kModelDims() {
  static const std::vector<int64_t> v = {1, 17, 96, 512, 0};
  return v;
}

inline MhaShape SeedShape(bool causal = false) {
  return MhaShape{/*batch=*/1, /*heads=*/8, /*kv_heads=*/8, /*seq_q=*/20, /*seq_kv=*/20,
                  /*head_dim=*/64, /*model_dim=*/512, causal};
}

namespace detail {
// `length` indices into a list of `n_values`, each value equally often
// (+-1), shuffled by Fisher-Yates with a fixed LCG so the list is the same
// with every standard library.
inline std::vector<size_t> BalancedShuffle(size_t n_values, size_t length, uint32_t seed) {
  std::vector<size_t> idx(length);
  for (size_t i = 0; i < length; ++i) idx[i] = i % n_values;
  uint32_t state = seed;
  for (size_t i = length - 1; i > 0; --i) {
    state = state * 1664525u + 1013904223u;
    const size_t j = (state >> 8) % (i + 1);
    std::swap(idx[i], idx[j]);
  }
  return idx;
}
}  // namespace detail

// Draws of the other parameters per (Sq, Skv, causal) triple.
constexpr size_t kDrawsPerSeqPair = 2;

// The seed (causal off and on), then every (Sq, Skv) pair x causal off/on,
// kDrawsPerSeqPair times with different batch, heads, head_dim and model_dim
// (2 + 8*8*2*2 = 258 shapes).
inline std::vector<MhaShape> FullSweepShapes() {
  const auto& seqs = kSeqLens();
  const size_t per_draw = seqs.size() * seqs.size() * 2;
  const size_t n = per_draw * kDrawsPerSeqPair;
  const auto batch_idx = detail::BalancedShuffle(kBatches().size(), n, 11);
  const auto heads_idx = detail::BalancedShuffle(kHeadConfigs().size(), n, 23);
  const auto dim_idx = detail::BalancedShuffle(kHeadDims().size(), n, 37);
  const auto model_idx = detail::BalancedShuffle(kModelDims().size(), n, 41);

  std::vector<MhaShape> shapes = {SeedShape(false), SeedShape(true)};
  for (size_t q = 0; q < n; ++q) {
    const size_t in_draw = q % per_draw;
    MhaShape s;
    s.seq_q = seqs[in_draw / (2 * seqs.size())];
    s.seq_kv = seqs[(in_draw / 2) % seqs.size()];
    s.causal = (in_draw % 2) == 1;
    s.batch = kBatches()[batch_idx[q]];
    s.heads = kHeadConfigs()[heads_idx[q]].first;
    s.kv_heads = kHeadConfigs()[heads_idx[q]].second;
    s.head_dim = kHeadDims()[dim_idx[q]];
    const int64_t d = kModelDims()[model_idx[q]];
    s.model_dim = d == 0 ? s.heads * s.head_dim : d;
    shapes.push_back(s);
  }
  return shapes;
}

// A smaller sweep for slower paths (the oneDNN twins): the seed plus every
// shape whose Sq and Skv are both in {1, 17, 65} (9 pairs x causal off/on x
// draws; includes Sq > Skv causal, i.e. fully masked rows).
inline std::vector<MhaShape> SmallSweepShapes() {
  auto in_small = [](int64_t s) { return s == 1 || s == 17 || s == 65; };
  const std::vector<MhaShape> all = FullSweepShapes();
  std::vector<MhaShape> out;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool is_seed = i < 2;  // SweepShapes starts with the seed, causal off and on
    if (is_seed || (in_small(all[i].seq_q) && in_small(all[i].seq_kv))) out.push_back(all[i]);
  }
  return out;
}

// HEADSUM_TEST_SWEEP=small in the environment makes the kernel tests sweep
// SmallSweepShapes() instead of the full list: scripts/arm.sh sets it for
// the runs under qemu, where the full sweep takes ~5x as long.
// HEADSUM_TEST_SWEEP=tiny is small, but the kernel tests sweep only its
// first draw (TinySweepShapes) and the dtype tests (TensorAttention) take
// every fourth dtype combination instead of every other: scripts/arm.sh
// sets it for the reference checks at 256 and 512 bits, where qemu runs SVE
// code about 11x as slowly as at 128 (there TensorAttention's small sweep
// alone took 67 s of a 109 s run; every combination runs at 128 bits).
inline bool TinySweepRequested() {
  const char* e = std::getenv("HEADSUM_TEST_SWEEP");
  return e != nullptr && std::strcmp(e, "tiny") == 0;
}
inline bool SmallSweepRequested() {
  const char* e = std::getenv("HEADSUM_TEST_SWEEP");
  return e != nullptr && (std::strcmp(e, "small") == 0 || TinySweepRequested());
}

// The small sweep's first draw only: the seed and one shape per (Sq, Skv)
// pair in {1, 17, 65} x causal off/on (20 shapes, about half).
inline std::vector<MhaShape> TinySweepShapes() {
  auto in_small = [](int64_t s) { return s == 1 || s == 17 || s == 65; };
  const std::vector<MhaShape> all = FullSweepShapes();
  const size_t per_draw = kSeqLens().size() * kSeqLens().size() * 2;
  std::vector<MhaShape> out;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool is_seed = i < 2, first_draw = i >= 2 && i - 2 < per_draw;
    if (is_seed || (first_draw && in_small(all[i].seq_q) && in_small(all[i].seq_kv))) {
      out.push_back(all[i]);
    }
  }
  return out;
}

// The list the kernel tests sweep: FullSweepShapes(), or SmallSweepShapes()
// when HEADSUM_TEST_SWEEP=small (TinySweepShapes() when =tiny).
inline std::vector<MhaShape> SweepShapes() {
  if (TinySweepRequested()) return TinySweepShapes();
  return SmallSweepRequested() ? SmallSweepShapes() : FullSweepShapes();
}

// The output projection has no Skv and no mask: the non-causal half of a
// sweep (seed included), seq = seq_q.
inline std::vector<MhaShape> NonCausal(const std::vector<MhaShape>& shapes) {
  std::vector<MhaShape> out;
  for (const MhaShape& s : shapes) {
    if (!s.causal) out.push_back(s);
  }
  return out;
}
inline std::vector<MhaShape> ProjectionSweepShapes() { return NonCausal(SweepShapes()); }
inline std::vector<MhaShape> FullProjectionSweepShapes() { return NonCausal(FullSweepShapes()); }

// Shapes whose sizes do not divide evenly by 2 or 8 threads (odd heads,
// batches, rows), for the thread-count determinism checks.
inline std::vector<MhaShape> DeterminismShapes() {
  return {
      SeedShape(true),
      MhaShape{3, 3, 1, 17, 65, 7, 17, true},
      MhaShape{1, 5, 0, 63, 130, 80, 96, false},
      MhaShape{2, 6, 2, 130, 17, 16, 1, true},  // Sq > Skv: fully masked rows
  };
}

}  // namespace headsum_shapes

#endif  // HEADSUM_TESTS_SHAPES_H_
