/* headsum over MPI: the attention layer's heads on several processes.
 *
 * Each rank holds one shard of the layer (headsum_mha_create_shard: whole
 * kv groups, only its own weight slices) and its own KV cache.  A shard's
 * forward is its partial sum, sum over its heads of O_h Wo[h] (+ bo on the
 * shard that starts at head 0); the layer's output is the sum of the
 * partials, which is exactly what MPI_Allreduce(MPI_SUM) computes:
 *
 *   y = sum_h O_h Wo[h] + bo = sum_ranks (sum_{h in rank} O_h Wo[h]) (+ bo once)
 *
 * Built when HEADSUM_WITH_MPI is ON (library headsum::mpi; libheadsum.a
 * itself never needs MPI). */
#ifndef HEADSUM_HEADSUM_MPI_H_
#define HEADSUM_HEADSUM_MPI_H_

#include <mpi.h>

#include "headsum/headsum.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over `comm`: every rank calls it with its shard, its cache (or
 * NULL on every rank), the same batch and seq, and the same x [B][S][Dm];
 * on return y [B][S][Dm] holds the whole layer's output on every rank (the
 * partial sums added in place by MPI_Allreduce).  The ranks' shards must
 * together cover every head of the layer once.  When any rank's arguments
 * are invalid, every rank returns HEADSUM_ERR_INVALID_ARGUMENT (the ranks
 * that were fine say which rank failed) and nothing is written anywhere.
 * When a rank's forward fails (out of memory), every rank returns an error;
 * y is then unspecified and the caches may differ.  An MPI failure is
 * HEADSUM_ERR_INTERNAL. */
headsum_status headsum_mha_forward_allreduce(const headsum_mha* mha, headsum_kv_cache* cache,
                                             int64_t batch, int64_t seq, const float* x,
                                             float* y, MPI_Comm comm);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* HEADSUM_HEADSUM_MPI_H_ */
