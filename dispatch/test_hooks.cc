#include "dispatch/test_hooks.h"

#include <atomic>

namespace headsum {
namespace {

// Allocations left before they start to fail; < 0: never fail.
std::atomic<long> g_allocations_left{-1};

std::atomic<size_t> g_stream_scores_bytes{testing::kDefaultStreamScoresBytes};
std::atomic<size_t> g_kv_in_cache_bytes{testing::kKvInCacheAuto};
std::atomic<int> g_row_stream{testing::kRowStreamAuto};
std::atomic<size_t> g_projection_l1{0}, g_projection_l2{0}, g_projection_rows{0};
std::atomic<int> g_projection_sweep_rows{testing::kSweepRowsAuto};

// Whether this allocation may go ahead: consumes one of the allowed ones.
bool AllocationAllowed() {
  long left = g_allocations_left.load(std::memory_order_relaxed);
  while (left > 0) {
    if (g_allocations_left.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
      return true;
    }
  }
  return left < 0;
}

}  // namespace

namespace testing {
void FailAllocationsAfter(long n) {
  g_allocations_left.store(n < 0 ? -1 : n, std::memory_order_relaxed);
}
void SetStreamScoresBytes(size_t bytes) {
  g_stream_scores_bytes.store(bytes, std::memory_order_relaxed);
}
void SetKvInCacheBytes(size_t bytes) {
  g_kv_in_cache_bytes.store(bytes, std::memory_order_relaxed);
}
void SetRowStream(int mode) { g_row_stream.store(mode, std::memory_order_relaxed); }
void SetProjectionCacheBytes(size_t l1, size_t l2) {
  g_projection_l1.store(l1, std::memory_order_relaxed);
  g_projection_l2.store(l2, std::memory_order_relaxed);
}
void SetProjectionPackedFromRows(size_t rows) {
  g_projection_rows.store(rows, std::memory_order_relaxed);
}
void SetProjectionSweepRows(int rows) {
  g_projection_sweep_rows.store(rows, std::memory_order_relaxed);
}
}  // namespace testing

namespace dispatch {
bool AllocationHookArmed() { return g_allocations_left.load(std::memory_order_relaxed) >= 0; }

size_t StreamScoresBytes() { return g_stream_scores_bytes.load(std::memory_order_relaxed); }

size_t KvInCacheBytes() { return g_kv_in_cache_bytes.load(std::memory_order_relaxed); }
int RowStreamMode() { return g_row_stream.load(std::memory_order_relaxed); }

size_t ProjectionL1Bytes() { return g_projection_l1.load(std::memory_order_relaxed); }
size_t ProjectionL2Bytes() { return g_projection_l2.load(std::memory_order_relaxed); }
size_t ProjectionPackedFromRows() { return g_projection_rows.load(std::memory_order_relaxed); }
int ProjectionSweepRows() { return g_projection_sweep_rows.load(std::memory_order_relaxed); }

hwy::AlignedFreeUniquePtr<float[]> AllocateFloats(size_t n) {
  if (!AllocationAllowed()) return hwy::AlignedFreeUniquePtr<float[]>(nullptr, hwy::AlignedFreer());
  // AllocateAligned returns null (never throws) when n * sizeof(float)
  // overflows or the allocator has no memory.
  return hwy::AllocateAligned<float>(n);
}
}  // namespace dispatch
}  // namespace headsum
