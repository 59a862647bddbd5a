#include "dispatch/threads.h"

#include <atomic>

namespace headsum {
namespace dispatch {
namespace {
std::atomic<int> g_num_threads{0};  // 0: OpenMP's default
}  // namespace

int NumThreads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
#ifdef HEADSUM_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void SetNumThreads(int n) { g_num_threads.store(n, std::memory_order_relaxed); }

}  // namespace dispatch
}  // namespace headsum
