// The rotary embedding's angles, computed once per layer: row p holds
// cos(p * f_i) for i < half, then sin(p * f_i), f_i = theta^(-2i/L), each
// computed in double and rounded once to f32.  The table grows to the
// positions asked for (a cache's capacity at its creation; a cache-less
// call's length) and never shrinks; the rows already handed out stay valid
// until the layer is freed, so callers on other threads never see them move.
#ifndef HEADSUM_LAYER_ROPE_TABLE_H_
#define HEADSUM_LAYER_ROPE_TABLE_H_

#include <stddef.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "hwy/aligned_allocator.h"

namespace headsum {
namespace layer {

class RopeTable {
 public:
  RopeTable(double theta, size_t head_dim);

  // Rows for positions [0, positions), or nullptr when the memory for them
  // is not there.  Takes a lock only when the table has to grow.
  const float* Rows(size_t positions);
  size_t half() const { return half_; }

 private:
  struct Table {
    size_t positions;
    hwy::AlignedFreeUniquePtr<float[]> rows;  // [positions][2 * half]
  };
  size_t half_;
  std::vector<double> inv_freq_;              // f_i, [half]
  std::mutex grow_;
  std::vector<std::unique_ptr<Table>> tables_;  // every size handed out, under grow_
  std::atomic<const Table*> current_{nullptr};  // the largest
};

}  // namespace layer
}  // namespace headsum

#endif  // HEADSUM_LAYER_ROPE_TABLE_H_
