// The attention paths' table (see attention_paths.h): which kernel of
// kernels/attention/ computes a block of query rows.  Compiled once; the
// kernels it points at are compiled per target in dispatch/attention_*.cc.
#include "dispatch/attention_paths.h"

#include <atomic>

#include "hwy/base.h"

#include "dispatch/targets.h"
#include "dispatch/test_hooks.h"
#include "hwy/targets.h"

namespace headsum {
namespace dispatch {
namespace {

bool IsAvx512(int64_t target) { return target == HWY_AVX3 || target == HWY_AVX3_DL; }
// The x86 targets with 16 vector registers (the narrow stream).
bool IsNarrowX86(int64_t target) {
  return target == HWY_AVX2 || target == HWY_SSE4 || target == HWY_SSSE3;
}
bool IsScalable(int64_t target) {
  return target == HWY_SVE || target == HWY_SVE2 || target == HWY_SVE_256 ||
         target == HWY_SVE2_128;
}
bool IsScalar(int64_t target) { return target == HWY_SCALAR || target == HWY_EMU128; }

bool Always(const BlockQuery&) { return true; }
bool FewRows(const BlockQuery& q) { return q.rows() <= kAttentionDotRows; }

// Decode groups: rows that all see the same keys, four at a time.  Not on
// SCALAR, where GCC 12 vectorizes the one-lane P V loop over a key's four
// contiguous weights into loads of two neighbouring V elements, the second
// past the end of the last V row (tests/guard_pages_test.cc).
// The paths that add a model's extras to their scores (softcap, ALiBi, a
// bias: AttnOptions::Scores) are the tiles, the rows by keys and the decode
// rows; the others run only blocks without them.
bool PlainScores(const BlockQuery& q) { return q.a.opt == nullptr || !q.a.opt->Scores(); }

bool GroupsRun(const BlockQuery& q) {
  return !IsScalar(q.target) && q.rows() >= kAttentionGroupRows && PlainScores(q) &&
         q.a.visible_keys(q.i0) == q.a.visible_keys(q.i1 - 1) &&
         q.a.first_key(q.i0) == q.a.first_key(q.i1 - 1);
}
// More rows than the row paths take, and few: up to four groups, or on 16
// or more lanes a block up to a quarter vector past one vector (the seed's
// 20 rows on AVX-512) over few keys.  The transposed tiles would pad such a
// block to two vectors of query lanes (37% of the QK^T lanes and of the
// softmax's are padding at 20 rows), and over a few keys nothing amortizes
// the block's Q transpose.  Measured on a Sapphire Rapids VM (B=1 H=8 L=64,
// Sq = Skv = S, one thread, buffers 16 bytes off, paired rounds, time
// grouped / transposed): S=20 0.82 (quartiles 0.82-0.84), S=24 0.97
// (0.94-1.10), S=36 1.05, S=44 1.10.
bool GroupsPicked(const BlockQuery& q) {
  const size_t rows = q.rows(), keys = q.key_end - q.key_begin;
  return rows > kAttentionDotRows &&
         (rows <= 4 * kAttentionGroupRows ||
          (q.lanes >= 16 && rows <= q.lanes + q.lanes / 4 && keys <= 2 * q.lanes));
}

// Keys along the lanes where a block of query lanes would be half padding;
// below 4 rows the K^T packing costs more than the dot products it saves.
bool RowsByKeysPicked(const BlockQuery& q) {
  return q.rows() > kAttentionDotRows && 2 * q.rows() <= q.lanes;
}

// The stream: K and V of one dtype, L a whole number of vectors (at most 8
// on the 32-register form); not on SCALAR or the scalable targets.
bool RowStreamRuns(const BlockQuery& q) {
  const size_t L = q.a.head_dim;
  if (IsScalar(q.target) || IsScalable(q.target) || !PlainScores(q)) return false;
  if (q.views.k.dtype != q.views.v.dtype || L % q.lanes != 0) return false;
  return IsNarrowX86(q.target) || L / q.lanes <= 8;
}
// K/V from memory on a CPU where dispatch prefers the stream
// (AttnDims::row_stream: dispatch/attention.cc, RowStreamFor); f32 rows only
// key by key (AttnDims::stream_key_by_key), the eight-key stream having
// been measured for 16-bit rows alone.  f32 rows key by key against the
// 512-key tiles (aligned rows) or their aligned-frame form (rows 16 bytes
// off), on a Zen 4 VM (a copy of both over one 64 MB f32 K and V stream,
// L=128, one thread, 15 rounds alternated, medians): 16 bytes off 57.2 ->
// 46.6 ns a key (17.9 -> 22.0 GB/s), aligned 58.4 -> 47.2; the eight-key
// stream with its prefetches 59.9 / 55.6.
bool RowStreamPicked(const BlockQuery& q) {
  return FewRows(q) && q.a.prefetch_kv && q.a.row_stream &&
         (q.views.k.dtype != DType::kF32 || q.a.stream_key_by_key);
}

// f32 rows that can be read in their aligned frame: every row equally
// misaligned (strides a multiple of 16 floats), L = 64 or 128, where the
// frame gives every product and sum of the aligned path in the same order:
// the results are bitwise those of aligned rows.
bool FrameFits(const TensorView& t, size_t L) {
  return t.ss % 16 == 0 && (L == 64 || L == 128);
}
uintptr_t KvRow0(const BlockQuery& q, const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.Row(q.b, q.h / q.a.group(), 0));
}
bool RowShiftedRuns(const BlockQuery& q) {
  const TensorView &k = q.views.k, &v = q.views.v;
  return IsAvx512(q.target) && PlainScores(q) && k.dtype == DType::kF32 &&
         v.dtype == DType::kF32 &&
         FrameFits(k, q.a.head_dim) && FrameFits(v, q.a.head_dim);
}
// Rows that start off a 64-byte boundary (a buffer 16 bytes off, as
// std::vector gives): each 512-bit load would span two cache lines.  An MHA
// decode step (H=8, L=64, Skv=512, one thread, K/V in L2, Zen 5, runs
// alternated with aligned buffers) with buffers 16 bytes off: 29.1-31.9 ->
// 23.7-24.9 us (aligned 24.0-27.2).
bool RowShiftedPicked(const BlockQuery& q) {
  return FewRows(q) && (KvRow0(q, q.views.k) | KvRow0(q, q.views.v)) % 64 != 0;
}

const AttnPath kPaths[] = {
    {AttnPathId::kGroups, "decode_groups", kAttentionGroupRows, GroupsRun, GroupsPicked,
     attn::GroupsBlock},
    {AttnPathId::kRowsByKeys, "rows_by_keys", 1, Always, RowsByKeysPicked,
     attn::RowsByKeysBlock},
    {AttnPathId::kRowStream, "decode_stream", 1, RowStreamRuns, RowStreamPicked,
     attn::RowStreamBlock},
    {AttnPathId::kRowShifted, "decode_rows_shifted", 1, RowShiftedRuns, RowShiftedPicked,
     attn::RowShiftedBlock},
    {AttnPathId::kRowDot, "decode_rows", 1, Always, FewRows, attn::RowDotBlock},
    {AttnPathId::kTiles, "prefill_tiles", 1, Always, Always, attn::TilesBlock},
};
static_assert(sizeof(kPaths) / sizeof(kPaths[0]) == kAttnPathCount, "one row per path");

std::atomic<int> forced_path{-1};
std::atomic<bool> counting{false};
std::atomic<uint64_t> rows_run[kAttnPathCount];

}  // namespace

const AttnPath* AttnPaths() { return kPaths; }

const AttnPath& PickAttnPath(const BlockQuery& q) {
  const int forced = forced_path.load(std::memory_order_relaxed);
  if (forced >= 0 && forced < static_cast<int>(kAttnPathCount) && kPaths[forced].runs(q)) {
    return kPaths[forced];
  }
  for (const AttnPath& p : kPaths) {
    if (p.runs(q) && p.picked(q)) return p;
  }
  return kPaths[kAttnPathCount - 1];  // the tiles run every block
}

AttnTarget AttnTargetOf(int64_t target) {
  const size_t t = TableIndex(target);
  return AttnTarget{target, t, attn::Lanes(t)};
}

void RunAttentionBlock(const AttnTarget& t, const AttnDims& a, const AttnViews& views, size_t b,
                       size_t h, size_t i0, size_t i1, size_t key_begin, size_t key_end,
                       float* partial, float* scratch) {
  // Under a sliding window the block starts at its first row's first key:
  // the paths skip the tiles before it (and, as causal rows do, those past
  // the last row's last key).
  if (a.window != 0) {
    key_begin = HWY_MAX(key_begin, a.first_key(i0));
    if (key_begin > key_end) key_begin = key_end;
  }
  while (i0 < i1) {
    const BlockQuery q{a, views, b, h, i0, i1, key_begin, key_end, t.target, t.lanes};
    const AttnPath& p = PickAttnPath(q);
    const size_t take = (i1 - i0) / p.row_multiple * p.row_multiple;
    if (counting.load(std::memory_order_relaxed)) {
      rows_run[static_cast<size_t>(p.id)].fetch_add(take, std::memory_order_relaxed);
    }
    p.kernel(t.index)(a, views, b, h, i0, i0 + take, key_begin, key_end, partial, scratch);
    if (partial != nullptr) partial += take * (a.head_dim + 2);
    i0 += take;
  }
}

void GroupDecodeHeads(const AttnDims& a, const AttnViews& views, AttnDims* grouped,
                      AttnViews* g, AttnOptions* grouped_opt) {
  *grouped = a;
  grouped->heads = a.kv_heads;
  grouped->seq_q = a.group();
  grouped->causal = false;
  grouped->rows_are_heads = a.group();
  if (a.opt != nullptr) {  // the bias's rows become the group's heads too
    *grouped_opt = *a.opt;
    grouped_opt->bias.ss = a.opt->bias.sh;
    grouped_opt->bias.sh = a.opt->bias.sh * a.group();
    grouped->opt = grouped_opt;
  }
  *g = views;
  g->q.ss = views.q.sh;
  g->q.sh = views.q.sh * a.group();
  g->out.ss = views.out.sh;
  g->out.sh = views.out.sh * a.group();
}

}  // namespace dispatch

namespace testing {

void ForceAttentionPath(int id) { dispatch::forced_path.store(id, std::memory_order_relaxed); }

void CountAttentionPathRows(bool on) {
  for (auto& n : dispatch::rows_run) n.store(0, std::memory_order_relaxed);
  dispatch::counting.store(on, std::memory_order_relaxed);
}

uint64_t AttentionPathRows(int id) {
  if (id < 0 || id >= static_cast<int>(dispatch::kAttnPathCount)) return 0;
  return dispatch::rows_run[id].load(std::memory_order_relaxed);
}

}  // namespace testing
}  // namespace headsum
