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

float* CallBuffer(CachedBuffer which, size_t n, hwy::AlignedFreeUniquePtr<float[]>* fresh) {
  if (AllocationHookArmed()) {
    *fresh = AllocateFloats(n);
    return fresh->get();
  }
  struct Kept {
    hwy::AlignedFreeUniquePtr<float[]> data{nullptr, hwy::AlignedFreer()};
    size_t size = 0;
  };
  thread_local Kept kept[3];
  Kept& k = kept[static_cast<int>(which)];
  if (k.size < n) {
    k.data.reset();  // the old one first: peak memory is the new size
    k.size = 0;
    k.data = AllocateFloats(n);
    if (!k.data) return nullptr;
    k.size = n;
  }
  return k.data.get();
}

}  // namespace dispatch
}  // namespace headsum
