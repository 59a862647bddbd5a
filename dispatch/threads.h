// Splitting a call's work items across threads.  Each item is computed by
// one thread from start to end in a fixed order, so results do not depend on
// the thread count; each thread allocates its scratch once per call, outside
// the loop over items.
#ifndef HEADSUM_DISPATCH_THREADS_H_
#define HEADSUM_DISPATCH_THREADS_H_

#include <stddef.h>

#include "headsum/headsum.h"
#include "dispatch/test_hooks.h"
#include "hwy/aligned_allocator.h"

#ifdef HEADSUM_HAVE_OPENMP
#include <omp.h>
#endif

namespace headsum {
namespace dispatch {

// Threads a call uses: headsum_set_num_threads(n), or OpenMP's default.
int NumThreads();
void SetNumThreads(int n);  // 0: default

// Buffers of the calling thread kept between calls (grow-only), so that a
// call's scratch costs no allocation and no page faults once the thread has
// made a call of that size: a decode step or a short sequence is then not
// dominated by mmap and first-touch faults.  One per use, so that a call may
// hold both at once.
enum class CachedBuffer { kScratch = 0, kPartials = 1, kWoPanels = 2 };

// A buffer of at least n floats for the calling thread's current call: the
// kept one, grown (through AllocateFloats) when too small.  While the test
// hook is armed, a fresh allocation owned by *fresh instead.  Null when the
// memory is not there.
float* CallBuffer(CachedBuffer which, size_t n, hwy::AlignedFreeUniquePtr<float[]>* fresh);

// Runs item(i, scratch) for i in [0, n_items), scratch holding
// `scratch_floats` floats private to the calling thread.  Items are handed
// out dynamically: callers order them most expensive first.
template <class Item>
headsum_status ParallelItems(size_t n_items, size_t scratch_floats, const Item& item) {
  if (n_items == 0) return HEADSUM_OK;
  const size_t threads = n_items < static_cast<size_t>(NumThreads())
                             ? n_items : static_cast<size_t>(NumThreads());
  // Every thread's scratch comes from one buffer obtained before any output
  // is touched: running out of memory fails the call cleanly.  Slices are
  // rounded to 64 floats so that threads never share a cache line.
  const size_t stride = (scratch_floats + 63) / 64 * 64;
  hwy::AlignedFreeUniquePtr<float[]> fresh;
  float* base = nullptr;
  if (stride != 0) {
    base = CallBuffer(CachedBuffer::kScratch, stride * threads, &fresh);
    if (base == nullptr) return HEADSUM_ERR_OUT_OF_MEMORY;
  }
#ifdef HEADSUM_HAVE_OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(static_cast<int>(threads))
    {
      float* const mine = base ? base + stride * static_cast<size_t>(omp_get_thread_num())
                               : nullptr;
#pragma omp for schedule(dynamic, 1)
      for (long long i = 0; i < static_cast<long long>(n_items); ++i) {
        item(static_cast<size_t>(i), mine);
      }
    }
    return HEADSUM_OK;
  }
#endif
  for (size_t i = 0; i < n_items; ++i) item(i, base);
  return HEADSUM_OK;
}

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_THREADS_H_
