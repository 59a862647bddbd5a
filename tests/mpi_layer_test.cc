// The layer's heads across processes: run by ctest through
//   mpiexec --allow-run-as-root --oversubscribe -np 2 (and -np 4)
// Every rank builds the whole layer's weights (from the same seeds), keeps
// its own shard (H / ranks query heads, whole kv groups) and a cache, and
// runs a prefill and 8 single-token steps through
// headsum_mha_forward_allreduce.  Each step's all-reduced y is checked on
// every rank against the single-process layer (headsum_mha_forward) and
// against the double reference, within derived bounds:
//   |y_mpi - exact|    <= sum_r bound_r + kSafety (R - 1) eps sum_r |partial_r|
//                         (each shard's LayerBound; the float sum of R partials)
//   |y_mpi - y_single| <= that + the single-process layer's LayerBound.
// Also: bad arguments on one rank fail every rank, without a hang, and
// nothing is written.  Exit status 0 only if every rank passed.
#include <mpi.h>
#include <stdio.h>

#include <cmath>
#include <string>
#include <vector>

#include "error_bounds.h"
#include "headsum/headsum.h"
#include "headsum/headsum_mpi.h"
#include "reference.h"
#include "test_util.h"

namespace headsum_test {
namespace {

constexpr int64_t kB = 2, kDm = 48, kH = 8, kHkv = 4, kL = 8, kPrefill = 6, kSteps = 8;
constexpr int64_t kT = kPrefill + kSteps;

struct Slices {
  std::vector<float> wq, wk, wv, wo, bq, bk, bv;
};

std::vector<float> Columns(const std::vector<float>& a, int64_t cols, int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (size_t r = 0; r < a.size() / size_t(cols); ++r) {
    out.insert(out.end(), a.begin() + int64_t(r) * cols + c0, a.begin() + int64_t(r) * cols + c1);
  }
  return out;
}

struct Whole {
  std::vector<float> wq = RandomUniform(kDm * kH * kL, -0.3f, 0.3f, 1);
  std::vector<float> wk = RandomUniform(kDm * kHkv * kL, -0.3f, 0.3f, 2);
  std::vector<float> wv = RandomUniform(kDm * kHkv * kL, -0.3f, 0.3f, 3);
  std::vector<float> wo = RandomUniform(kH * kL * kDm, -0.3f, 0.3f, 4);
  std::vector<float> bq = RandomUniform(kH * kL, -0.5f, 0.5f, 5);
  std::vector<float> bk = RandomUniform(kHkv * kL, -0.5f, 0.5f, 6);
  std::vector<float> bv = RandomUniform(kHkv * kL, -0.5f, 0.5f, 7);
  std::vector<float> bo = RandomUniform(kDm, -0.5f, 0.5f, 8);
  std::vector<float> x = RandomUniform(kB * kT * kDm, -1.0f, 1.0f, 9);

  // Query heads [h0, h1): their own slices only.
  Slices Shard(int64_t h0, int64_t h1) const {
    const int64_t g0 = h0 / (kH / kHkv), g1 = h1 / (kH / kHkv);
    Slices s;
    s.wq = Columns(wq, kH * kL, h0 * kL, h1 * kL);
    s.wk = Columns(wk, kHkv * kL, g0 * kL, g1 * kL);
    s.wv = Columns(wv, kHkv * kL, g0 * kL, g1 * kL);
    s.wo.assign(wo.begin() + h0 * kL * kDm, wo.begin() + h1 * kL * kDm);
    s.bq.assign(bq.begin() + h0 * kL, bq.begin() + h1 * kL);
    s.bk.assign(bk.begin() + g0 * kL, bk.begin() + g1 * kL);
    s.bv.assign(bv.begin() + g0 * kL, bv.begin() + g1 * kL);
    return s;
  }
};

headsum_mha_config Config() {
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

RefLayerSpec Spec(const Slices& s, int64_t heads, const float* bo) {
  return RefLayerSpec{kDm, heads, heads / (kH / kHkv), kL, true, 10000.0, HEADSUM_F32,
                      s.wq.data(), s.wk.data(), s.wv.data(), s.wo.data(), s.bq.data(),
                      s.bk.data(), s.bv.data(), bo};
}

std::vector<float> Tokens(const std::vector<float>& x, int64_t t0, int64_t t1) {
  std::vector<float> out;
  for (int64_t b = 0; b < kB; ++b) {
    out.insert(out.end(), x.begin() + (b * kT + t0) * kDm, x.begin() + (b * kT + t1) * kDm);
  }
  return out;
}

int failures = 0;
int rank = 0, ranks = 1;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    fprintf(stderr, "rank %d: FAIL: %s\n", rank, what.c_str());
  }
}

void Run() {
  const Whole w;
  const headsum_mha_config config = Config();
  const int64_t per = kH / ranks;
  std::vector<Slices> shards;
  for (int r = 0; r < ranks; ++r) shards.push_back(w.Shard(r * per, (r + 1) * per));
  const Slices& mine = shards[size_t(rank)];

  headsum_mha *shard = nullptr, *single = nullptr;
  Check(headsum_mha_create_shard(&config, rank * per, (rank + 1) * per, mine.wq.data(),
                                 mine.wk.data(), mine.wv.data(), mine.wo.data(), mine.bq.data(),
                                 mine.bk.data(), mine.bv.data(), w.bo.data(), &shard) == HEADSUM_OK,
        std::string("create_shard: ") + headsum_last_error());
  Check(headsum_mha_create(&config, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                           w.bq.data(), w.bk.data(), w.bv.data(), w.bo.data(),
                           &single) == HEADSUM_OK,
        std::string("create: ") + headsum_last_error());
  headsum_kv_cache *cache = nullptr, *single_cache = nullptr;
  Check(headsum_kv_cache_create(shard, kB, kT, &cache) == HEADSUM_OK, "shard cache");
  Check(headsum_kv_cache_create(single, kB, kT, &single_cache) == HEADSUM_OK, "single cache");
  if (failures) return;

  // Bad arguments on one rank (the last): every rank refuses, nothing written.
  {
    const std::vector<float> x = Tokens(w.x, 0, 1);
    std::vector<float> y = Sentinels(x.size());
    const int64_t seq = rank == ranks - 1 ? 0 : 1;
    const headsum_status st =
        headsum_mha_forward_allreduce(shard, cache, kB, seq, x.data(), y.data(), MPI_COMM_WORLD);
    Check(st == HEADSUM_ERR_INVALID_ARGUMENT,
          std::string("bad seq on the last rank: got ") + StatusName(st));
    const std::string message = headsum_last_error();
    Check(rank == ranks - 1 ? message.find("seq = 0") != std::string::npos
                            : message.find("rank " + std::to_string(ranks - 1)) != std::string::npos,
          "message names the argument or the rank: " + message);
    Check(y == Sentinels(x.size()), "y untouched after a refused call");
    Check(headsum_kv_cache_length(cache) == 0, "cache untouched after a refused call");
  }

  const Slices all = w.Shard(0, kH);
  const RefLayerSpec whole_spec = Spec(all, kH, w.bo.data());
  int64_t t0 = 0;
  std::vector<int64_t> chunks = {kPrefill};
  for (int s = 0; s < kSteps; ++s) chunks.push_back(1);
  for (int64_t len : chunks) {
    const std::vector<float> x = Tokens(w.x, t0, t0 + len);
    const std::vector<float> seen = Tokens(w.x, 0, t0 + len);
    std::vector<float> y_mpi = Sentinels(x.size()), y_single = Sentinels(x.size());
    headsum_status st = headsum_mha_forward_allreduce(shard, cache, kB, len, x.data(),
                                                      y_mpi.data(), MPI_COMM_WORLD);
    Check(st == HEADSUM_OK, std::string("forward_allreduce: ") + headsum_last_error());
    st = headsum_mha_forward(single, single_cache, kB, len, x.data(), y_single.data());
    Check(st == HEADSUM_OK, std::string("forward: ") + headsum_last_error());
    if (failures) return;

    // sum_r bound_r + kSafety (R - 1) eps sum_r (|ref_r| + bound_r).
    std::vector<double> bound(x.size(), 0.0), partial_magnitude(x.size(), 0.0);
    for (int r = 0; r < ranks; ++r) {
      const RefLayerSpec spec = Spec(shards[size_t(r)], per, r == 0 ? w.bo.data() : nullptr);
      const std::vector<double> ref = RefLayerForward(spec, seen.data(), kB, t0 + len, t0);
      const std::vector<double> b = LayerBound(spec, seen.data(), kB, t0 + len, t0);
      for (size_t i = 0; i < b.size(); ++i) {
        bound[i] += b[i];
        partial_magnitude[i] += std::fabs(ref[i]) + b[i];
      }
    }
    for (size_t i = 0; i < bound.size(); ++i) {
      bound[i] += kSafety * double(ranks - 1) * kEps * partial_magnitude[i];
    }
    const Layout layout{{kB, len, kDm}, "bsd"};
    const std::string at = "tokens [" + std::to_string(t0) + ", " + std::to_string(t0 + len) + ")";
    testing::AssertionResult r = AllWithinBound(
        RefLayerForward(whole_spec, seen.data(), kB, t0 + len, t0), bound, y_mpi, layout);
    Check(bool(r), at + ": all-reduced y vs reference: " + r.message());
    std::vector<double> both = LayerBound(whole_spec, seen.data(), kB, t0 + len, t0);
    for (size_t i = 0; i < both.size(); ++i) both[i] += bound[i];
    r = AllWithinBound(std::vector<double>(y_single.begin(), y_single.end()), both, y_mpi, layout);
    Check(bool(r), at + ": all-reduced y vs the single-process layer: " + r.message());
    t0 += len;
  }
  Check(headsum_kv_cache_length(cache) == kT, "cache length after prefill and steps");
  headsum_kv_cache_free(cache);
  headsum_kv_cache_free(single_cache);
  headsum_mha_free(shard);
  headsum_mha_free(single);
}

}  // namespace
}  // namespace headsum_test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &headsum_test::rank);
  MPI_Comm_size(MPI_COMM_WORLD, &headsum_test::ranks);
  if (headsum_test::kH % headsum_test::ranks != 0 ||
      (headsum_test::kH / headsum_test::ranks) % (headsum_test::kH / headsum_test::kHkv) != 0) {
    if (headsum_test::rank == 0) {
      fprintf(stderr, "%d ranks cannot split %lld heads into whole kv groups\n",
              headsum_test::ranks, static_cast<long long>(headsum_test::kH));
    }
    MPI_Finalize();
    return 2;
  }
  headsum_test::Run();
  int total = 0;
  MPI_Allreduce(&headsum_test::failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (headsum_test::rank == 0) {
    printf("mpi layer test, %d ranks, target %s: %s (%d failures)\n", headsum_test::ranks,
           headsum_active_target(), total == 0 ? "PASSED" : "FAILED", total);
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
