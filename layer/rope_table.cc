#include "layer/rope_table.h"

#include <string.h>

#include <cmath>
#include <new>

#include "dispatch/test_hooks.h"

namespace headsum {
namespace layer {

RopeTable::RopeTable(double theta, size_t head_dim) : half_(head_dim / 2), inv_freq_(half_) {
  for (size_t i = 0; i < half_; ++i) {
    inv_freq_[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
}

const float* RopeTable::Rows(size_t positions) {
  const Table* now = current_.load(std::memory_order_acquire);
  if (now != nullptr && now->positions >= positions) return now->rows.get();
  std::lock_guard<std::mutex> lock(grow_);
  now = current_.load(std::memory_order_relaxed);
  if (now != nullptr && now->positions >= positions) return now->rows.get();
  // At least double, so that a cache-less caller whose length creeps up by
  // one token per call triggers O(log n) growths, not n.
  const size_t old = now == nullptr ? 0 : now->positions;
  const size_t grown = positions > 2 * old ? positions : 2 * old;
  const size_t width = 2 * half_;
  std::unique_ptr<Table> table(new (std::nothrow) Table{grown, dispatch::AllocateFloats(grown * width)});
  if (!table || !table->rows) return nullptr;
  float* rows = table->rows.get();
  if (old != 0) memcpy(rows, now->rows.get(), old * width * sizeof(float));
  for (size_t p = old; p < grown; ++p) {
    for (size_t i = 0; i < half_; ++i) {
      const double angle = static_cast<double>(p) * inv_freq_[i];
      rows[p * width + i] = static_cast<float>(std::cos(angle));
      rows[p * width + half_ + i] = static_cast<float>(std::sin(angle));
    }
  }
  const Table* published = table.get();
  try {
    tables_.push_back(std::move(table));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  current_.store(published, std::memory_order_release);
  return published->rows.get();
}

}  // namespace layer
}  // namespace headsum
