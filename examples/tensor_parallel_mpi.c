/* Tensor parallelism with the additive view: the layer's heads split across
 * MPI ranks, each rank holding only its own weight slices and its own KV
 * cache.  Each rank's forward is its partial sum, sum over its heads of
 * O_h Wo[h]; MPI_Allreduce(MPI_SUM) adds the partials, and every rank ends
 * with the whole layer's y.  Run:
 *
 *   mpirun -np 2 ./tensor_parallel_mpi          (add --allow-run-as-root as root)
 *
 * Dm = 512, H = 8, Hkv = 8, L = 64; ranks must divide 8.  Every weight is a
 * function of its global index, so each rank generates only its own slice,
 * as it would load only its slice from a checkpoint. */
#include <headsum/headsum.h>
#include <headsum/headsum_mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { kDm = 512, kH = 8, kL = 64, kPrompt = 128, kSteps = 64 };

/* Weight `which` at (row, col) of the whole layer's matrix: a hash in +-scale. */
static float weight(unsigned which, long long row, long long col, float scale) {
  unsigned long long h = (unsigned long long)which * 0x9E3779B97F4A7C15ull ^
                         (unsigned long long)row * 0xBF58476D1CE4E5B9ull ^
                         (unsigned long long)col * 0x94D049BB133111EBull;
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return scale * ((float)(h & 0xFFFFFF) / 8388608.0f - 1.0f);
}

/* Columns [c0, c1) of the whole [rows][...] matrix `which`. */
static float* columns(unsigned which, long long rows, long long c0, long long c1, float scale) {
  float* w = malloc((size_t)(rows * (c1 - c0)) * sizeof(float));
  if (w == NULL) exit(1);
  for (long long r = 0; r < rows; ++r)
    for (long long c = c0; c < c1; ++c) w[r * (c1 - c0) + (c - c0)] = weight(which, r, c, scale);
  return w;
}

/* Rows [r0, r1) of the whole [...][cols] matrix `which`. */
static float* rows_of(unsigned which, long long r0, long long r1, long long cols, float scale) {
  float* w = malloc((size_t)((r1 - r0) * cols) * sizeof(float));
  if (w == NULL) exit(1);
  for (long long r = r0; r < r1; ++r)
    for (long long c = 0; c < cols; ++c) w[(r - r0) * cols + c] = weight(which, r, c, scale);
  return w;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, ranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (kH % ranks != 0) {
    if (rank == 0) fprintf(stderr, "the number of ranks must divide %d heads\n", kH);
    MPI_Finalize();
    return 1;
  }
  /* This rank's heads and its slices: columns of Wq, Wk, Wv; rows of Wo. */
  const long long h0 = (long long)rank * kH / ranks, h1 = h0 + kH / ranks;
  const float s_in = 1.0f / sqrtf((float)kDm), s_out = 1.0f / sqrtf((float)(kH * kL));
  float* wq = columns(1, kDm, h0 * kL, h1 * kL, s_in);
  float* wk = columns(2, kDm, h0 * kL, h1 * kL, s_in);
  float* wv = columns(3, kDm, h0 * kL, h1 * kL, s_in);
  float* wo = rows_of(4, h0 * kL, h1 * kL, kDm, s_out);
  float* bo = rows_of(5, 0, 1, kDm, 0.1f); /* added once, by the shard at head 0 */

  const headsum_mha_config config = {kDm, kH, 0, kL, 1, 10000.0f, HEADSUM_F32, HEADSUM_F32};
  headsum_mha* shard = NULL;
  headsum_kv_cache* cache = NULL;
  float* x = rows_of(6, 0, kPrompt, kDm, 1.0f); /* the same prompt on every rank */
  float* y = malloc((size_t)kPrompt * kDm * sizeof(float));
  if (y == NULL ||
      headsum_mha_create_shard(&config, h0, h1, wq, wk, wv, wo, NULL, NULL, NULL, bo,
                               &shard) != HEADSUM_OK ||
      headsum_kv_cache_create(shard, 1, kPrompt + kSteps, &cache) != HEADSUM_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, headsum_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  free(wq), free(wk), free(wv), free(wo), free(bo);

  /* Prefill, then single-token steps: each call is the shard's forward plus
   * one MPI_Allreduce of y; every rank feeds back the same (whole) y. */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  headsum_status st = headsum_mha_forward_allreduce(shard, cache, 1, kPrompt, x, y, MPI_COMM_WORLD);
  const double prefill_s = MPI_Wtime() - t0;
  float* token = x;
  t0 = MPI_Wtime();
  for (int t = 0; st == HEADSUM_OK && t < kSteps; ++t) {
    const float* last = t == 0 ? y + (kPrompt - 1) * kDm : y;
    double sum = 0.0;
    for (int i = 0; i < kDm; ++i) sum += (double)last[i] * last[i];
    const float inv = (float)(1.0 / sqrt(sum / kDm + 1e-6));
    for (int i = 0; i < kDm; ++i) token[i] = last[i] * inv;
    st = headsum_mha_forward_allreduce(shard, cache, 1, 1, token, y, MPI_COMM_WORLD);
  }
  const double decode_s = MPI_Wtime() - t0;
  if (st != HEADSUM_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, headsum_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    printf("%d ranks x %d heads (target %s): prefill %d tokens %.2f ms, %d steps at %.0f "
           "tokens/s; y[0][:4] = %.5f %.5f %.5f %.5f\n",
           ranks, kH / ranks, headsum_active_target(), kPrompt, 1e3 * prefill_s, kSteps,
           kSteps / decode_s, y[0], y[1], y[2], y[3]);
  }
  headsum_kv_cache_free(cache);
  headsum_mha_free(shard);
  free(x), free(y);
  MPI_Finalize();
  return 0;
}
