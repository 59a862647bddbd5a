// The attention kernels' paths and the one table that picks among them.
//
// A fused attention call is cut into blocks of query rows (at most
// kAttentionQueryBlock rows of one head over a range of keys).  Each block
// runs on one of the paths of kernels/attention/ (each path a kernel of its
// own, compiled per target in its own translation unit); which one is decided
// here and nowhere else: AttnPaths() lists them in the order dispatch tries
// them, each with what it can compute (`runs`) and when it is the one picked
// (`picked`), from the block's shape, dtypes and memory, the target and
// whether K/V come from memory (AttnDims::prefetch_kv).  The tests iterate
// the same table and force each path on every target it runs on.
#ifndef HEADSUM_DISPATCH_ATTENTION_PATHS_H_
#define HEADSUM_DISPATCH_ATTENTION_PATHS_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/shapes.h"

namespace headsum {
namespace dispatch {

// Rows [i0, i1) of head (b, h) over keys [key_begin, key_end): final rows
// into views.out (partial == nullptr) or partial records (acc[L], m, l) per
// row; scratch: AttentionScratchFloats() floats.
using AttnBlockFn = void (*)(const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                             size_t i0, size_t i1, size_t key_begin, size_t key_end,
                             float* partial, float* scratch);

enum class AttnPathId : int {
  kGroups = 0,    // decode_groups-inl.h
  kRowsByKeys,    // rows_by_keys-inl.h
  kRowStream,     // decode_stream-inl.h
  kRowShifted,    // decode_rows-inl.h, the aligned-frame form (AVX-512)
  kRowDot,        // decode_rows-inl.h
  kTiles,         // prefill_tiles-inl.h
  kCount
};

// What the table looks at for one block.
struct BlockQuery {
  const AttnDims& a;
  const AttnViews& views;
  size_t b, h, i0, i1, key_begin, key_end;
  int64_t target;  // the Highway target the call runs on
  size_t lanes;    // its f32 lanes
  size_t rows() const { return i1 - i0; }
};

struct AttnPath {
  AttnPathId id;
  const char* name;
  // Rows it computes of a block are a multiple of this (the rest of the
  // block goes to the next pick).
  size_t row_multiple;
  // Whether it computes this block correctly on this target.
  bool (*runs)(const BlockQuery&);
  // Whether dispatch picks it for this block (first in table order whose
  // runs and picked both hold).
  bool (*picked)(const BlockQuery&);
  // Its kernel for the target at this dispatch-table index.
  AttnBlockFn (*kernel)(size_t table_index);
};

// The table, kAttnPathCount rows, in the order dispatch tries them.
constexpr size_t kAttnPathCount = static_cast<size_t>(AttnPathId::kCount);
const AttnPath* AttnPaths();

// The path dispatch runs a block on (a path forced by
// testing::ForceAttentionPath where it runs the block).
const AttnPath& PickAttnPath(const BlockQuery& q);

// The target a call runs on, as the table and the kernels' accessors need it.
struct AttnTarget {
  int64_t target;  // Highway target bit
  size_t index;    // its dispatch-table index (TableIndex)
  size_t lanes;    // its f32 lanes
};
AttnTarget AttnTargetOf(int64_t target);

// Runs rows [i0, i1) of head (b, h) over keys [key_begin, key_end) on the
// paths the table picks (a block may take two: groups, then rows).
void RunAttentionBlock(const AttnTarget& t, const AttnDims& a, const AttnViews& views, size_t b,
                       size_t h, size_t i0, size_t i1, size_t key_begin, size_t key_end,
                       float* partial, float* scratch);

// A decode step (Sq = 1) of grouped heads as one head of H/Hkv rows per kv
// head: the query rows of the heads that share a kv head are one head
// stride apart in Q and O, so K and V are read once per group.
// rows_are_heads tells the kernels each row's head and position; a call's
// options are copied into *grouped_opt with the bias regrouped alike (null
// only for calls without options).
void GroupDecodeHeads(const AttnDims& a, const AttnViews& views, AttnDims* grouped,
                      AttnViews* grouped_views, AttnOptions* grouped_opt = nullptr);

// Work items (b, h, row block), most expensive first: under a causal mask
// the last rows see the most keys, so blocks are handed out from the bottom.
struct RowBlocks {
  const AttnDims& a;
  size_t block;
  size_t per_head() const { return (a.seq_q + block - 1) / block; }
  size_t count() const { return a.batch * a.heads * per_head(); }
  template <class F>
  void Run(size_t item, const F& f) const {
    const size_t n = per_head();
    const size_t blk = n - 1 - item % n;
    const size_t bh = item / n;
    const size_t i0 = blk * block;
    const size_t i1 = i0 + block < a.seq_q ? i0 + block : a.seq_q;
    f(bh / a.heads, bh % a.heads, i0, i1);
  }
};

// The per-target kernels, one accessor per translation unit's export
// (dispatch/attention_*.cc), indexed by TableIndex(target).
namespace attn {
AttnBlockFn TilesBlock(size_t t);
AttnBlockFn RowsByKeysBlock(size_t t);
AttnBlockFn RowDotBlock(size_t t);
AttnBlockFn RowShiftedBlock(size_t t);
AttnBlockFn RowStreamBlock(size_t t);
AttnBlockFn GroupsBlock(size_t t);
size_t Lanes(size_t t);
size_t ScratchFloats(size_t t, const AttnDims& a, const AttnViews& views);
size_t HeadPackFloats(size_t t, const AttnDims& a, const AttnViews& views);
size_t HeadPackedScratchFloats(size_t t, const AttnDims& a, const AttnViews& views);
void PackHeadViews(size_t t, const AttnDims& a, const AttnViews& views, size_t b, size_t h,
                   uint64_t call, float* scratch, AttnViews* packed);
size_t MergeScratchFloats(size_t t, const AttnDims& a);
void MergeKeySplits(size_t t, const AttnDims& a, const float* partials, size_t splits,
                    const TensorView& out, size_t b, size_t h, size_t i0, size_t i1,
                    float* scratch);
}  // namespace attn

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_ATTENTION_PATHS_H_
