// The library's single allocation point, and a test hook that makes it fail;
// and the size above which scores are streamed to memory, which tests lower.
//
// Every buffer the library allocates for itself (per-thread scratch in
// ParallelItems, attention's key-split partials, attribution's Wo directions^T,
// a reusable attribution basis) comes from AllocateFloats, so a test can make
// the n-th allocation fail and check that the call returns
// HEADSUM_ERR_OUT_OF_MEMORY, writes no output and leaks nothing.
#ifndef HEADSUM_DISPATCH_TEST_HOOKS_H_
#define HEADSUM_DISPATCH_TEST_HOOKS_H_

#include <stddef.h>
#include <stdint.h>

#include "hwy/aligned_allocator.h"

namespace headsum {
namespace testing {

// n >= 0: the next n allocations succeed (memory permitting), every one after
// them fails until the next call.  n < 0 (the start-up state): no allocation
// is made to fail.  Process-wide: the counter is one std::atomic, shared by
// every thread.  For tests only.
void FailAllocationsAfter(long n);

// Score tensors (qk_scores) larger than this many bytes are written with
// non-temporal stores; default kDefaultStreamScoresBytes.  Tests set 0 to run
// the streaming path on small shapes.  Process-wide; for tests only.
constexpr size_t kDefaultStreamScoresBytes = size_t{64} << 20;
void SetStreamScoresBytes(size_t bytes);

// An attention call's K and V of up to this many bytes count as read from
// the caches: the one-row dot path then scores eight keys at a time without
// software prefetch; above it, one key at a time with K/V rows prefetched
// ahead.  kKvInCacheAuto (the default): half the last-level cache that
// sysconf reports, at most 16 MiB.  Tests set 0 to run the prefetching path
// on small shapes.  Process-wide; for tests only.
constexpr size_t kKvInCacheAuto = ~size_t{0};
void SetKvInCacheBytes(size_t bytes);

// Whether a one-row decode over 16-bit K/V read from memory runs on the
// streaming kernel (AttnDims::row_stream) and how: kRowStreamAuto (the
// default) as dispatch chooses for this CPU, 0 never (512-key tiles), 1
// wherever the kernel exists with keys scored eight at a time and software
// prefetch, 2 wherever it exists with keys scored one at a time and no
// software prefetch (AttnDims::stream_key_by_key).  Tests set each to run
// every path on every CPU.  Process-wide; for tests only.
constexpr int kRowStreamAuto = -1;
void SetRowStream(int mode);

// The L1 data and L2 sizes, in bytes, that the chained projection blocks
// its work for (dispatch/projection.cc); 0: what sysconf reports.  Tests set
// small ones to run one-tile blocks of O and the panel-group-by-group order
// on small shapes.  Process-wide; for tests only.
void SetProjectionCacheBytes(size_t l1, size_t l2);

// Rows (batch x sequence) from which the chained projection packs O in
// blocks (dispatch/projection.cc, kCopyWoRows); 0: that default.  Tests set
// 3 to run that path on every shape of three rows a sequence or more.
// Process-wide; for tests only.
void SetProjectionPackedFromRows(size_t rows);

// How a decode step's projection (one row) sweeps a 16-bit Wo:
// kSweepRowsAuto (the default) as dispatch chooses (two rows a pass for a
// Wo the call before read, one otherwise: ProjDims::wo_recent), 1 one row
// a pass, 2 two rows a pass.  Both give the same bits.  Tests set each to
// run both.  Process-wide; for tests only.
constexpr int kSweepRowsAuto = 0;
void SetProjectionSweepRows(int rows);

// Heads per group of a decode step's projection (one or two rows a
// sequence; dispatch/projection.cc, DecodeHeadsPerGroup) for this shape and
// Wo element size in bytes: Y's row is then the sum, group by group in
// order, of what the many-row tiles give each group's heads (bias in the
// first), rounded once.  `heads` means one group.  For tests, which
// rebuild those sums.
size_t ProjectionDecodeHeadsPerGroup(size_t batch, size_t seq, size_t heads, size_t head_dim,
                                     size_t model_dim, size_t wo_bytes);

// The fused attention's block paths (dispatch/attention_paths.h, AttnPathId):
// ForceAttentionPath(id) makes every block that path id runs take it (the
// others as the table picks; -1, the start-up state: none forced).
// CountAttentionPathRows(true) zeroes and starts per-path counts of the
// query rows each path ran, AttentionPathRows(id) reads one.  Process-wide;
// for tests only.
void ForceAttentionPath(int id);
void CountAttentionPathRows(bool on);
uint64_t AttentionPathRows(int id);

}  // namespace testing

namespace dispatch {

// `n` floats, aligned as hwy::AllocateAligned aligns them, or a null pointer
// when the memory is not there: the allocator failed, n * sizeof(float)
// overflows size_t, or FailAllocationsAfter said so.  Never throws, never
// aborts.  The one way the library allocates its buffers.
hwy::AlignedFreeUniquePtr<float[]> AllocateFloats(size_t n);

// Whether FailAllocationsAfter has armed the hook (n >= 0): buffers that
// are otherwise kept between calls are then allocated per call, so that the
// hook reaches every allocation a call would make on a fresh thread.
bool AllocationHookArmed();

// The current threshold of SetStreamScoresBytes.
size_t StreamScoresBytes();

// The current threshold of SetKvInCacheBytes (kKvInCacheAuto: not set).
size_t KvInCacheBytes();

// The mode of SetRowStream (kRowStreamAuto: not set).
int RowStreamMode();

// The sizes of SetProjectionCacheBytes (0: not set).
size_t ProjectionL1Bytes();
size_t ProjectionL2Bytes();
size_t ProjectionPackedFromRows();

// The mode of SetProjectionSweepRows (kSweepRowsAuto: not set).
int ProjectionSweepRows();

}  // namespace dispatch
}  // namespace headsum

#endif  // HEADSUM_DISPATCH_TEST_HOOKS_H_
