// headsum_mha_forward_allreduce: the shard's forward, then one
// MPI_Allreduce(MPI_SUM) in place on y.  The per-head sum of the output
// projection is the all-reduce: each rank adds its heads' O_h Wo[h], MPI adds
// the ranks.  Two small collectives keep the ranks in step when one of them
// fails: one on the arguments before anything is written, one on the forward
// before the data is reduced.
#include <limits.h>
#include <stdio.h>

#include <algorithm>

#include "dispatch/validate.h"
#include "headsum/headsum_mpi.h"
#include "layer/mha.h"

using headsum::dispatch::Fail;

namespace {

// What the ranks agree on: the largest status any rank had (every failure
// outranks HEADSUM_OK = 0) and the lowest rank that had it.
struct Agreement {
  headsum_status status;
  int rank;
};

// MPI_MINLOC on (-status, rank): the largest status, then the lowest rank.
headsum_status Agree(const char* fn, headsum_status mine, MPI_Comm comm, Agreement* all) {
  int rank = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) {
    return Fail(HEADSUM_ERR_INTERNAL, fn, "MPI_Comm_rank failed");
  }
  struct {
    int value, rank;
  } in = {-static_cast<int>(mine), rank}, out = {0, 0};
  if (MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS) {
    return Fail(HEADSUM_ERR_INTERNAL, fn, "MPI_Allreduce of the ranks' status failed");
  }
  all->status = static_cast<headsum_status>(-out.value);
  all->rank = out.rank;
  return HEADSUM_OK;
}

// Every rank returns a failure that any rank had: its own message when the
// failure is its own, else one naming the rank that failed.
headsum_status Settle(const char* fn, headsum_status mine, const Agreement& all,
                      const char* what) {
  if (mine != HEADSUM_OK) return mine;
  return Fail(all.status, fn, "rank %d failed %s (status %d); see its headsum_last_error()",
              all.rank, what, static_cast<int>(all.status));
}

}  // namespace

extern "C" headsum_status headsum_mha_forward_allreduce(const headsum_mha* mha,
                                                        headsum_kv_cache* cache, int64_t batch,
                                                        int64_t seq, const float* x, float* y,
                                                        MPI_Comm comm) {
  static const char* fn = "headsum_mha_forward_allreduce";
  if (comm == MPI_COMM_NULL) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "comm is MPI_COMM_NULL");
  }
  Agreement all;
  headsum_status mine = headsum::layer::CheckForward(fn, mha, cache, batch, seq, x, y);
  if (headsum_status s = Agree(fn, mine, comm, &all)) return s;
  if (all.status != HEADSUM_OK) return Settle(fn, mine, all, "the argument checks");

  mine = headsum::layer::Forward(fn, mha, cache, batch, seq, x, y);
  if (headsum_status s = Agree(fn, mine, comm, &all)) return s;
  if (all.status != HEADSUM_OK) return Settle(fn, mine, all, "its forward");

  // y += the other ranks' partial sums, in chunks that an int count holds.
  int64_t left = headsum::layer::OutputElements(mha, batch, seq);
  for (float* at = y; left > 0;) {
    const int n = static_cast<int>(std::min<int64_t>(left, INT_MAX));
    if (MPI_Allreduce(MPI_IN_PLACE, at, n, MPI_FLOAT, MPI_SUM, comm) != MPI_SUCCESS) {
      return Fail(HEADSUM_ERR_INTERNAL, fn, "MPI_Allreduce of y failed");
    }
    at += n;
    left -= n;
  }
  return HEADSUM_OK;
}
