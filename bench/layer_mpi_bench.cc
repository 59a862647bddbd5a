// layer_mpi_bench: the layer's heads across MPI ranks (headsum::mpi) against
// one process, Dm = 512, H = 8, L = 64, causal, f32: a prefill of S = 512
// into an empty cache and a decode step over 4096 cached tokens, medians of
// repeated runs (wall time, rank 0, after a barrier).  Compare
//   OMP_NUM_THREADS=1 mpirun --bind-to none -np 2 headsum_layer_mpi_bench  (2 ranks x 1 thread)
//   OMP_NUM_THREADS=2 mpirun --bind-to none -np 1 headsum_layer_mpi_bench  (1 process x 2 threads)
// (--bind-to none: Open MPI binds each rank to one core when there are at
// most two, so the single process's two threads would share one core.)
#include <mpi.h>
#include <stdio.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "headsum/headsum.h"
#include "headsum/headsum_mpi.h"

namespace {

constexpr int64_t kDm = 512, kH = 8, kL = 64, kPrefill = 512, kCached = 4096;

std::vector<float> Random(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = scale * (float(seed >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, ranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int64_t per = kH / ranks, h0 = rank * per;
  // This rank's slices (any values: the cost does not depend on them).
  const std::vector<float> wq = Random(size_t(kDm * per * kL), 0.04f, 1 + uint32_t(rank));
  const std::vector<float> wk = Random(size_t(kDm * per * kL), 0.04f, 11 + uint32_t(rank));
  const std::vector<float> wv = Random(size_t(kDm * per * kL), 0.04f, 21 + uint32_t(rank));
  const std::vector<float> wo = Random(size_t(per * kL * kDm), 0.04f, 31 + uint32_t(rank));
  const std::vector<float> bo = Random(size_t(kDm), 0.1f, 41);
  const headsum_mha_config config = {kDm, kH, 0, kL, 1, 0.0f, HEADSUM_F32, HEADSUM_F32};
  headsum_mha* mha = nullptr;
  headsum_kv_cache *prefill_cache = nullptr, *decode_cache = nullptr;
  if (headsum_mha_create_shard(&config, h0, h0 + per, wq.data(), wk.data(), wv.data(),
                               wo.data(), nullptr, nullptr, nullptr, bo.data(), &mha) ||
      headsum_kv_cache_create(mha, 1, kPrefill, &prefill_cache) ||
      headsum_kv_cache_create(mha, 1, kCached + 1, &decode_cache)) {
    fprintf(stderr, "rank %d: %s\n", rank, headsum_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const std::vector<float> x = Random(size_t(kCached * kDm), 1.0f, 51);
  std::vector<float> y(x.size());
  // Fill the decode cache with 4096 tokens.
  if (headsum_mha_forward_allreduce(mha, decode_cache, 1, kCached, x.data(), y.data(),
                                    MPI_COMM_WORLD)) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<double> prefill, decode;
  for (int rep = 0; rep < 11; ++rep) {
    headsum_kv_cache_reset(prefill_cache);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    headsum_mha_forward_allreduce(mha, prefill_cache, 1, kPrefill, x.data(), y.data(),
                                  MPI_COMM_WORLD);
    prefill.push_back(MPI_Wtime() - t0);
  }
  for (int rep = 0; rep < 201; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    headsum_mha_forward_allreduce(mha, decode_cache, 1, 1, x.data(), y.data(), MPI_COMM_WORLD);
    decode.push_back(MPI_Wtime() - t0);
    headsum_kv_cache_truncate(decode_cache, kCached);
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int threads = omp != nullptr ? std::atoi(omp) : 0;  // 0: OpenMP's default
  if (rank == 0) {
    printf("%d rank(s) x %d thread(s), target %s: prefill S=512 median %.0f us; decode over "
           "4096 median %.0f us\n",
           ranks, threads, headsum_active_target(),
           1e6 * Median(prefill), 1e6 * Median(decode));
  }
  headsum_kv_cache_free(prefill_cache);
  headsum_kv_cache_free(decode_cache);
  headsum_mha_free(mha);
  MPI_Finalize();
  return 0;
}
