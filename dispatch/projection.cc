// Exports the projection kernels (project_heads_sum and the per-head views)
// for every compiled target and splits their work across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch/projection.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/project_heads_sum-inl.h"

#if HWY_ONCE
#include <string.h>

#include <atomic>
#include <unistd.h>

#include "dispatch/native_ops.h"
#include "dispatch/ops.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"
#include "dispatch/test_hooks.h"
#include "hwy/aligned_allocator.h"

namespace headsum {
HWY_EXPORT(SumHeadsTile);
HWY_EXPORT(ChainTile);
HWY_EXPORT(ChainBlock);
HWY_EXPORT(ChainScratch);
HWY_EXPORT(SumHeadGroups);
HWY_EXPORT(PackRowsOfO);
HWY_EXPORT(PackedOFloats);
HWY_EXPORT(PackWoRowsF32);
HWY_EXPORT(PanelFloats);
HWY_EXPORT(PackedRowBlock);
HWY_EXPORT(ContributionNormsRows);
HWY_EXPORT(NormsScratch);
HWY_EXPORT(ProjectWeightsOntoDirections);
HWY_EXPORT(AttributionRows);

namespace dispatch {
namespace {

// Rows of Y per work item (a multiple of the 6-row microkernel tile).
constexpr size_t kRowBlock = 48;
// Columns of Y per work item, so that small S still splits across threads
// (a multiple of every target's 2-vector tile).
constexpr size_t kColBlock = 128;
// Rows of an item from which the plain call copies each Wo panel into
// contiguous f32 scratch as its first row tile reads it (ChainTile's
// pack_into), for the other tiles to read; fewer rows (a decode step) read
// Wo in place.
constexpr size_t kPackPanelRows = 8;
// Rows (batch x sequence) from which the plain call makes an f32 copy of
// the whole Wo in packed panels (PackWoRowsF32) before its rows run over
// them; fewer rows read Wo in place.  Paired, one SPR core / two, H*L = D =
// 512, O packed in both: in place over copied, S=20 0.57x the time, S=128
// 0.96x / 0.86x, S=512 0.98x / 1.15x, S=2048 1.01x / 1.16-1.22x (two
// threads reading Wo in place lose 15-20%; the copy costs about what 15
// rows do).
constexpr size_t kCopyWoRows = 256;

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Part `part` of `parts` of rows [s0, s1) of batch b of O (every head) asked
// into L2: spread over a block's panels, it brings the next block's rows of
// O in under the arithmetic, where PackRowsOfO would otherwise wait on them.
void PrefetchRowsOfO(const ProjDims& p, const TensorView& heads, size_t b, size_t s0, size_t s1,
                     size_t part, size_t parts) {
  const size_t rows = s1 - s0, n = p.heads * rows;
  const size_t row_bytes = p.head_dim * DTypeBytes(heads.dtype);
  for (size_t i = part * n / parts; i < (part + 1) * n / parts; ++i) {
    const char* row = heads.Row(b, i / rows, s0 + i % rows);
    // A loop of prefetches alone has no effect that GCC must keep: it
    // deletes such a loop, and the calls to a function made of one.  The
    // empty asm that takes each address is one it must keep.
    for (size_t off = 0; off < row_bytes; off += 64) {
      __builtin_prefetch(row + off, 0, 2);
      asm volatile("" : : "r"(row + off));
    }
    __builtin_prefetch(row + row_bytes - 1, 0, 2);
  }
}

bool EveryGateIsOne(const float* head_gates, size_t heads) {
  if (head_gates == nullptr) return true;
  for (size_t h = 0; h < heads; ++h) {
    if (head_gates[h] != 1.0f) return false;
  }
  return true;
}

}  // namespace

// The L1 data and L2 sizes of this CPU (sysconf), or 32 and 256 KiB when
// it does not say (or the sizes a test set: SetProjectionCacheBytes).
size_t CacheBytes(int name, size_t fallback) {
  const long r = sysconf(name);
  return r > 0 ? static_cast<size_t>(r) : fallback;
}
size_t L1Bytes() {
  static const size_t bytes = CacheBytes(_SC_LEVEL1_DCACHE_SIZE, size_t{32} << 10);
  return ProjectionL1Bytes() != 0 ? ProjectionL1Bytes() : bytes;
}
size_t L2Bytes() {
  static const size_t bytes = CacheBytes(_SC_LEVEL2_CACHE_SIZE, size_t{256} << 10);
  return ProjectionL2Bytes() != 0 ? ProjectionL2Bytes() : bytes;
}

// Rows of O per work item of the chained sum: as many as fill half the L2
// ([H*L] floats a row), in whole kChainRows tiles, 1 to 8 of them.
size_t ChainRowBlock(const ProjDims& p) {
  const size_t rows = L2Bytes() / 2 / (p.inner() * sizeof(float));
  return HWY_MIN(HWY_MAX(rows / kChainRows, size_t{1}), size_t{8}) * kChainRows;
}

// The in-place call's column panels.  Without a peel: kWoPanelCols wide
// from column 0.  With one: a first panel [0, first), then kWoPanelCols wide
// from `first` on, where `first` puts each later panel's start in every row
// of Wo on a 64-byte boundary.  Wo 16 bytes past a boundary (a std::vector's
// start), each row tile that reads it in place splits every other load
// across two lines: S=20 D=512, one thread, 145 -> 154 us on the Zen 3 VM
// (the panel copy's first tile reads all of Wo that way).  The first panel
// is 16 columns or more, so that its tail is one overlapping vector, not
// single lanes (ChainTileT's overlap_tail); so is the last: where fewer than
// 16 columns would be left for it, the panel before it is 32 wide.
struct ColumnPanels {
  size_t first = 0;  // 0: no peel
  size_t count = 0;
  bool short_last = false;  // the panel before the last is 32 columns wide
  size_t Begin(size_t k) const {
    if (first == 0) return k * kWoPanelCols;
    if (k == 0) return 0;
    if (short_last && k == count - 1) return first + (k - 2) * kWoPanelCols + 32;
    return first + (k - 1) * kWoPanelCols;
  }
  size_t End(size_t k, size_t model_dim) const {
    return k + 1 < count ? Begin(k + 1) : model_dim;
  }
};

ColumnPanels InPlacePanels(const ProjDims& p, const WoSource& wo, bool peel) {
  ColumnPanels panels;
  panels.count = WoPanels(p.model_dim);
  const size_t bytes = DTypeBytes(wo.dtype);
  const size_t misaligned = reinterpret_cast<uintptr_t>(wo.data) % 64;
  if (!peel || wo.packed || misaligned == 0 || misaligned % bytes != 0 ||
      wo.stride * bytes % 64 != 0) {
    return panels;
  }
  size_t first = (64 - misaligned) / bytes;
  while (first < 16) first += 64 / bytes;
  if (first + kWoPanelCols > p.model_dim) return panels;
  panels.first = first;
  panels.count = 1 + CeilDiv(p.model_dim - first, kWoPanelCols);
  const size_t rest = (p.model_dim - first) % kWoPanelCols;
  panels.short_last = rest != 0 && rest < 16 && panels.count >= 3;
  return panels;
}

// Heads per group of a decode step's projection (DecodeByHeadGroups):
// groups of at least kDecodeGroupBytes of Wo each, as few as that allows,
// their partial sums ([B][groups][S][D] f32) at most kDecodePartialBytes
// and a 16th of Wo's bytes (what they add to the traffic).  Depends on the
// shape and Wo's element size only, never on the thread count.  p.heads
// (one group: the tiles' own sums) for three rows a sequence or more.
constexpr size_t kDecodeGroupBytes = size_t{64} << 10;
constexpr size_t kDecodePartialBytes = size_t{1} << 20;

size_t DecodeHeadsPerGroup(const ProjDims& p, size_t wo_bytes) {
  if (p.seq > 2 || p.heads < 2) return p.heads;
  const size_t head_bytes = HWY_MAX(p.head_dim * p.model_dim * wo_bytes, size_t{1});
  size_t per_group = CeilDiv(kDecodeGroupBytes, head_bytes);
  const size_t partial_row = HWY_MAX(p.batch * p.seq * p.model_dim * sizeof(float), size_t{1});
  const size_t partial_max = HWY_MIN(kDecodePartialBytes, p.heads * head_bytes / 16);
  const size_t max_groups = HWY_MAX(partial_max / partial_row, size_t{1});
  if (CeilDiv(p.heads, per_group) > max_groups) per_group = CeilDiv(p.heads, max_groups);
  return HWY_MIN(per_group, p.heads);
}

// A decode step (one or two rows a sequence) over groups of heads, each
// group's partial sums of Y ([B][groups][S][D], f32, bias in group 0's)
// from the tiles of ChainTile, then Y = ((P_0 + P_1) + P_2) + ... rounded
// once.  A work item is one sequence's group (times a range of columns
// where the threads need more items): each reads its heads' rows of Wo
// whole, a contiguous stretch of an unpacked Wo, where splitting the
// columns across threads has each read a part of every row.  On a Zen 4
// VM a core reading half of each 1 KiB row (a 512 x 512 bf16 Wo on two
// threads) got ~6 GB/s from memory, against ~24 GB/s reading whole rows
//.
headsum_status DecodeByHeadGroups(const ProjDims& p, const TensorView& heads, const WoSource& wo,
                                  const float* bias, const TensorView& y, size_t per_group) {
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(ChainTile)[t];
  const size_t groups = CeilDiv(p.heads, per_group);
  const size_t ldp = (p.model_dim + 15) / 16 * 16;
  const size_t rows = p.batch * p.seq;
  hwy::AlignedFreeUniquePtr<float[]> fresh;
  float* const part = CallBuffer(CachedBuffer::kPartials, rows * groups * ldp, &fresh);
  if (part == nullptr) return HEADSUM_ERR_OUT_OF_MEMORY;
  const ColumnPanels cp = InPlacePanels(p, wo, false);
  const size_t panels = cp.count;
  const size_t units = p.batch * groups;
  const size_t col_groups = HWY_MIN(panels, CeilDiv(static_cast<size_t>(NumThreads()), units));
  const size_t per_col_group = CeilDiv(panels, col_groups);
  const size_t bytes = DTypeBytes(wo.dtype), inner = p.inner(), L = p.head_dim;
  const size_t chain_floats =
      (HWY_DISPATCH_TABLE(ChainScratch)[t](p, heads.dtype, DType::kF32) + 15) / 16 * 16;
  const char* const base = static_cast<const char*>(wo.data);
  headsum_status st = ParallelItems(units * col_groups, chain_floats,
                                    [&](size_t item, float* scratch) {
    const size_t cg = item % col_groups, unit = item / col_groups;
    const size_t g = unit % groups, b = unit / groups;
    const size_t h0 = g * per_group, h1 = HWY_MIN(h0 + per_group, p.heads);
    const size_t first = cg * per_col_group, last = HWY_MIN(first + per_col_group, panels);
    if (first >= last) return;
    ProjDims pg = p;
    pg.heads = h1 - h0;
    TensorView hv = heads;
    hv.data = heads.Row(0, h0, 0);
    TensorView yv;
    yv.data = part + g * p.seq * ldp;
    yv.dtype = DType::kF32;
    yv.sb = groups * p.seq * ldp;
    yv.sh = 0;
    yv.ss = ldp;
    const float* const bias_g = g == 0 ? bias : nullptr;
    if (!wo.packed) {
      // The range's columns in one piece (the one-row sweeps' whole rows).
      const size_t c0 = cp.Begin(first), c1 = cp.End(last - 1, p.model_dim);
      kernel(pg, hv, base + (h0 * L * wo.stride + c0) * bytes, wo.dtype, wo.stride, bias_g, yv,
             b, 0, p.seq, c0, c1, scratch, nullptr);
      return;
    }
    for (size_t panel = first; panel < last; ++panel) {
      // Panel `panel` holds Wo's columns [c0, c1) as rows of c1 - c0.
      const size_t c0 = cp.Begin(panel), c1 = cp.End(panel, p.model_dim);
      kernel(pg, hv, base + (c0 * inner + h0 * L * (c1 - c0)) * bytes, wo.dtype, c1 - c0, bias_g,
             yv, b, 0, p.seq, c0, c1, scratch, nullptr);
    }
  });
  if (st != HEADSUM_OK) return st;
  // The sums: one item for a small Y (a parallel region costs more than
  // the adds), else one a row.
  const auto sum = HWY_DISPATCH_TABLE(SumHeadGroups)[t];
  const bool one_item = rows * groups * ldp <= (size_t{1} << 16);
  return ParallelItems(one_item ? 1 : rows, 0, [&](size_t item, float*) {
    const size_t r0 = one_item ? 0 : item, r1 = one_item ? rows : item + 1;
    for (size_t r = r0; r < r1; ++r) {
      const size_t b = r / p.seq, s = r % p.seq;
      sum(part + (b * groups * p.seq + s) * ldp, p.seq * ldp, groups, p.model_dim,
          y.Row(b, 0, s), y.dtype);
    }
  });
}

// Whether a decode step (one row a sequence) reads a 16-bit Wo in place
// that is likely still in cache: the decode step before read the same Wo
// (the same address), and it fits the L2s of the threads.  An engine
// stepping through a model's layers passes another layer's Wo each call,
// from memory once the weights outgrow the caches; a loop over one layer
// passes the same.  Only the order of RowSweep's reads depends on it
// (ProjDims::wo_recent), never the result.
bool DecodeWoRecent(const ProjDims& p, const WoSource& wo) {
  const int forced = ProjectionSweepRows();
  if (forced != testing::kSweepRowsAuto) return forced == 2;
  if (wo.packed || p.seq != 1 || wo.dtype == DType::kF32) return false;
  static std::atomic<const void*> last{nullptr};
  const void* const before = last.exchange(wo.data, std::memory_order_relaxed);
  const size_t bytes = p.inner() * wo.stride * DTypeBytes(wo.dtype);
  return before == wo.data && bytes <= L2Bytes() * static_cast<size_t>(NumThreads());
}

// ChainedSum for fewer than kCopyWoRows rows (B x S) and for one or two
// rows a sequence: O read in place, Wo in place or from headsum_wo_pack's
// panels.  A work item is a block of
// rows (sized to the L2) times a group of Wo panels; inside it, panel by
// panel, the rows run in kChainRows tiles: the block of O is read from
// memory once and from L2 for every other panel, a panel from L2 once per
// tile.  (Items of one panel each, the earlier order, re-read all of O once
// per panel: 11 times at D = 512, from DRAM once O outgrows the L2.)
// Panels are split into groups only as far as the threads need items.
// Every element of Y is one FMA chain whatever the blocking: the result
// does not depend on it, nor on the thread count.
headsum_status ChainedSumInPlace(const ProjDims& p, const TensorView& heads,
                                 const WoSource& wo, const float* bias, const TensorView& y) {
  if (p.seq <= 2) {
    const size_t per_group = DecodeHeadsPerGroup(p, DTypeBytes(wo.dtype));
    if (per_group < p.heads) return DecodeByHeadGroups(p, heads, wo, bias, y, per_group);
  }
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(ChainTile)[t];
  const size_t mc = ChainRowBlock(p);
  const size_t row_blocks = CeilDiv(p.seq, mc), blocks = p.batch * row_blocks;
  const size_t threads = static_cast<size_t>(NumThreads());
  // One or two rows (a decode step) read Wo in place, each element once, in
  // column tiles that each sweep all of Wo's rows: an item takes its
  // group's panels as one column range (MatMul's widest tiles, fewer
  // sweeps), and the groups are as few as the threads need (one per
  // thread for one sequence): longer runs of each Wo row per sweep, which
  // is what keeps a Wo from memory streaming.
  const bool few_rows = !wo.packed && p.seq <= 2;
  // (Their sweeps keep the panels from column 0: a Wo streamed from memory
  // is read row by row there, and a peel would add a narrow column range.)
  const ColumnPanels cp = InPlacePanels(p, wo, !few_rows);
  const size_t panels = cp.count;
  const size_t groups = HWY_MIN(panels, CeilDiv((few_rows ? 1 : 4) * threads, blocks));
  const size_t per_group = CeilDiv(panels, groups);
  const size_t bytes = DTypeBytes(wo.dtype);
  const bool copies_panels = !wo.packed && HWY_MIN(mc, p.seq) >= kPackPanelRows;
  // The panel copy after the kernel's own scratch, on a 64-byte boundary.
  const size_t chain_floats = (HWY_DISPATCH_TABLE(ChainScratch)[t](p, heads.dtype, y.dtype) + 15) /
                              16 * 16;
  const size_t panel_floats = copies_panels ? HWY_DISPATCH_TABLE(PanelFloats)[t](p) : 0;
  return ParallelItems(blocks * groups, chain_floats + panel_floats,
                       [&](size_t item, float* scratch) {
    const size_t group = item % groups, block = item / groups;
    const size_t b = block / row_blocks, r0 = block % row_blocks * mc;
    const size_t r1 = HWY_MIN(r0 + mc, p.seq);
    // A block of a few rows (the last of a sequence) reads Wo in place.
    const bool copies = copies_panels && r1 - r0 >= kPackPanelRows;
    const size_t panel_end = HWY_MIN((group + 1) * per_group, panels);
    // Few rows: the group's panels as one range of columns.
    const size_t panel_step = few_rows ? per_group : 1;
    for (size_t panel = group * per_group; panel < panel_end; panel += panel_step) {
      const size_t c0 = cp.Begin(panel);
      const size_t c1 = cp.End(few_rows ? panel_end - 1 : panel, p.model_dim);
      const char* base = static_cast<const char*>(wo.data);
      const void* wo_c0 = wo.packed ? base + c0 * p.inner() * bytes : base + c0 * bytes;
      size_t ldw = wo.packed ? c1 - c0 : wo.stride;
      DType wo_dtype = wo.dtype;
      float* panel_f32 = scratch + chain_floats;
      size_t s0 = r0;
      if (copies) {
        // The first tile of rows reads Wo in place and fills the panel.
        const size_t s1 = HWY_MIN(s0 + kChainRows, r1);
        kernel(p, heads, wo_c0, wo_dtype, ldw, bias, y, b, s0, s1, c0, c1, scratch, panel_f32);
        s0 = s1;
        wo_c0 = panel_f32;
        wo_dtype = DType::kF32;
        ldw = c1 - c0;
      }
      for (; s0 < r1; s0 += kChainRows) {
        kernel(p, heads, wo_c0, wo_dtype, ldw, bias, y, b, s0, HWY_MIN(s0 + kChainRows, r1), c0,
               c1, scratch, nullptr);
      }
    }
  });
}

// Y = bias + sum_h O_h Wo[h] with the heads summed in registers.  Below
// kCopyWoRows rows (B x S), and for one or two rows a sequence (decode
// steps), ChainedSumInPlace.  From there on, Wo is read from
// headsum_wo_pack's panels or, in the plain call, from an f32 copy of Wo in
// those panels made first (PackWoRowsF32), and O is packed (PackRowsOfO) a
// block of rows at a time, blocks of about a quarter of the L2
// (PackedRowBlock): a work item is one block times a group of Wo panels;
// it packs its block once and runs it over each panel of its group in turn
// (ChainBlock: the panel in blocks of kc rows that stay in L1, the packed
// block read from L2), reading each panel once from L3 or memory, and asks
// the next block's rows of O into L2 under this block's arithmetic.  Panels
// are split into groups only as far as the threads need items.  Every
// element of Y is one FMA chain whatever the blocking: the result does not
// depend on it, nor on the thread count.
// (Formerly blocks of O were sized to the L1, 12 rows
// on Zen 3, and groups of panels to half the L2, each panel read whole from
// L2 once per row tile, and O packed again for every group: H*L = D = 512,
// S = 512, one Zen 3 core, 16 bytes off: 3343-3443 us against oneDNN's
// 3104, S = 2048 13.5-13.9 ms against 11.6-12.0.)
headsum_status ChainedSum(const ProjDims& p, const TensorView& heads, const WoSource& wo,
                          const float* bias, const TensorView& y) {
  // bf16 O and Wo (or any, under fpmath BF16) on a native bf16 path in force;
  // a packed handle serves it when it holds the native panels.
  if (const native::Path* n = NativeFor({heads.dtype, wo.dtype})) {
    if (!wo.packed) {
      TensorView wo_view;
      wo_view.data = const_cast<void*>(wo.data);
      wo_view.dtype = wo.dtype;
      wo_view.ss = wo.stride;
      return NativeProjection(*n, p, heads, &wo_view, nullptr, bias, y);
    }
    if (wo.native != nullptr) return NativeProjection(*n, p, heads, nullptr, wo.native, bias, y);
  }
  const size_t from_rows = ProjectionPackedFromRows() != 0 ? ProjectionPackedFromRows() : kCopyWoRows;
  if (p.batch * p.seq < from_rows || p.seq <= 2) {
    ProjDims in_place = p;
    in_place.wo_recent = DecodeWoRecent(p, wo);
    return ChainedSumInPlace(in_place, heads, wo, bias, y);
  }
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(ChainBlock)[t];
  const size_t panels = WoPanels(p.model_dim), inner = p.inner();
  const size_t threads = static_cast<size_t>(NumThreads());
  // Where the panels are read from, and as what.
  const char* wo_base = static_cast<const char*>(wo.data);
  DType wo_dtype = wo.dtype;
  hwy::AlignedFreeUniquePtr<float[]> fresh;
  if (!wo.packed) {
    float* copy = CallBuffer(CachedBuffer::kWoPanels, inner * p.model_dim, &fresh);
    if (copy == nullptr) return HEADSUM_ERR_OUT_OF_MEMORY;
    // Items of Wo rows, each row read once in order and split among the
    // panels: as many items as the threads need.
    const auto pack_rows = HWY_DISPATCH_TABLE(PackWoRowsF32)[t];
    const size_t per_item = CeilDiv(inner, HWY_MIN(inner, 4 * threads));
    const headsum_status st = ParallelItems(CeilDiv(inner, per_item), 0, [&](size_t i, float*) {
      pack_rows(p, wo.data, wo.dtype, wo.stride, i * per_item, HWY_MIN(inner, (i + 1) * per_item),
                copy);
    });
    if (st != HEADSUM_OK) return st;
    wo_base = reinterpret_cast<const char*>(copy);
    wo_dtype = DType::kF32;
  }
  const size_t bytes = DTypeBytes(wo_dtype);
  // Rows of a panel per block: half the L1 for kc x kWoPanelCols elements.
  const size_t kc = HWY_MAX(L1Bytes() / 2 / (kWoPanelCols * bytes) / 8 * 8, size_t{8});
  const size_t mc = HWY_DISPATCH_TABLE(PackedRowBlock)[t](p, L2Bytes(), threads);
  const size_t row_blocks = CeilDiv(p.seq, mc), blocks = p.batch * row_blocks;
  const size_t groups = HWY_MIN(panels, CeilDiv(2 * threads, blocks));
  const size_t per_group = CeilDiv(panels, groups);
  // ChainBlock's partial sums of Y, [mc][kWoPanelCols], then the packed block.
  const size_t y_floats = (mc * kWoPanelCols + 15) / 16 * 16;
  const size_t o_floats = HWY_DISPATCH_TABLE(PackedOFloats)[t](p, mc);
  const auto pack_o = HWY_DISPATCH_TABLE(PackRowsOfO)[t];
  return ParallelItems(blocks * groups, y_floats + o_floats, [&](size_t item, float* scratch) {
    const size_t group = item % groups, block = item / groups;
    const size_t b = block / row_blocks, r0 = block % row_blocks * mc;
    const size_t r1 = HWY_MIN(r0 + mc, p.seq);
    float* o_packed = scratch + y_floats;
    pack_o(p, heads, b, r0, r1, o_packed);
    const size_t first = group * per_group, end = HWY_MIN(first + per_group, panels);
    // The block this thread is likely to take next (items are handed out in
    // order, one at a time): its rows of O, a part after each panel.
    const size_t next = block + threads;
    const bool prefetches = groups == 1 && next < blocks;
    for (size_t panel = first; panel < end; ++panel) {
      const size_t c0 = panel * kWoPanelCols, c1 = HWY_MIN(c0 + kWoPanelCols, p.model_dim);
      kernel(p, o_packed, wo_base + c0 * inner * bytes, wo_dtype, c1 - c0, bias, y, b, r0, r1, c0,
             c1, kc, scratch);
      if (prefetches) {
        const size_t next_r0 = next % row_blocks * mc;
        PrefetchRowsOfO(p, heads, next / row_blocks, next_r0, HWY_MIN(next_r0 + mc, p.seq),
                        panel - first, end - first);
      }
    }
  });
}

namespace {

}  // namespace

headsum_status PackWo(const ProjDims& p, const WoSource& wo, void* packed) {
  const size_t inner = p.inner(), D = p.model_dim, bytes = DTypeBytes(wo.dtype);
  return ParallelItems(WoPanels(D), 0, [&](size_t panel, float*) {
    const size_t c0 = panel * kWoPanelCols, width = HWY_MIN(kWoPanelCols, D - c0);
    char* dst = static_cast<char*>(packed) + c0 * inner * bytes;
    const char* src = static_cast<const char*>(wo.data) + c0 * bytes;
    for (size_t k = 0; k < inner; ++k) {
      memcpy(dst + k * width * bytes, src + k * wo.stride * bytes, width * bytes);
    }
  });
}

headsum_status PackWo(const ProjDims& p, const float* wo, float* packed) {
  return PackWo(p, WoSource{wo, DType::kF32, p.model_dim, false}, packed);
}

headsum_status ProjectHeadsSumPacked(const ProjDims& p, const float* heads,
                                     const float* packed_wo, const float* bias, float* y) {
  return ChainedSum(p, ContiguousF32(heads, p.heads, p.seq, p.head_dim),
                    WoSource{packed_wo, DType::kF32, 0, true}, bias, ContiguousYF32(p, y));
}

headsum_status ProjectHeadsSum(const ProjDims& p, const float* heads, const float* wo,
                               const float* bias, const float* head_gates, float* y,
                               float* per_head) {
  if (per_head == nullptr && EveryGateIsOne(head_gates, p.heads)) {
    return ChainedSum(p, ContiguousF32(heads, p.heads, p.seq, p.head_dim),
                      WoSource{wo, DType::kF32, p.model_dim, false}, bias,
                      ContiguousYF32(p, y));
  }
  const auto kernel = HWY_DISPATCH_TABLE(SumHeadsTile)[TableIndex(ActiveTarget())];
  const ProjectArgs args{heads, wo, bias, head_gates, y, per_head};
  const size_t row_blocks = CeilDiv(p.seq, kRowBlock);
  const size_t col_blocks = CeilDiv(p.model_dim, kColBlock);
  return ParallelItems(p.batch * row_blocks * col_blocks, 0, [&](size_t item, float*) {
    const size_t cb = item % col_blocks, rb = item / col_blocks % row_blocks;
    const size_t b = item / col_blocks / row_blocks;
    const size_t s0 = rb * kRowBlock, c0 = cb * kColBlock;
    kernel(p, args, b, s0, HWY_MIN(s0 + kRowBlock, p.seq), c0,
           HWY_MIN(c0 + kColBlock, p.model_dim));
  });
}

headsum_status HeadContributionNorms(const ProjDims& p, const float* heads, const float* wo,
                                     float* out) {
  const size_t t = TableIndex(ActiveTarget());
  const auto kernel = HWY_DISPATCH_TABLE(ContributionNormsRows)[t];
  const size_t row_blocks = CeilDiv(p.seq, kRowBlock);
  return ParallelItems(p.batch * row_blocks, HWY_DISPATCH_TABLE(NormsScratch)[t](p),
                       [&](size_t item, float* scratch) {
                         const size_t b = item / row_blocks, s0 = item % row_blocks * kRowBlock;
                         kernel(p, heads, wo, out, b, s0, HWY_MIN(s0 + kRowBlock, p.seq),
                                scratch);
                       });
}

namespace {

// The two halves of attribution on one target, chosen once per call.
headsum_status WeightsOntoDirections(size_t t, const ProjDims& p, const float* wo,
                                     const float* directions, size_t n_directions,
                                     float* wd) {
  const auto kernel = HWY_DISPATCH_TABLE(ProjectWeightsOntoDirections)[t];
  const size_t rows = p.inner();
  constexpr size_t kWeightRows = 64;
  return ParallelItems(CeilDiv(rows, kWeightRows), 0, [&](size_t item, float*) {
    const size_t k0 = item * kWeightRows;
    kernel(p, wo, directions, n_directions, wd, k0, HWY_MIN(k0 + kWeightRows, rows));
  });
}

headsum_status AttributionThroughBasis(size_t t, const ProjDims& p, const float* heads,
                                       const float* wd, size_t n_directions, float* out) {
  const auto kernel = HWY_DISPATCH_TABLE(AttributionRows)[t];
  const size_t row_blocks = CeilDiv(p.seq, kRowBlock);
  return ParallelItems(p.batch * row_blocks, 0, [&](size_t item, float*) {
    const size_t b = item / row_blocks, s0 = item % row_blocks * kRowBlock;
    kernel(p, heads, wd, n_directions, out, b, s0, HWY_MIN(s0 + kRowBlock, p.seq));
  });
}

}  // namespace

headsum_status ProjectWeightsOntoDirections(const ProjDims& p, const float* wo,
                                           const float* directions, size_t n_directions,
                                           float* wd) {
  return WeightsOntoDirections(TableIndex(ActiveTarget()), p, wo, directions, n_directions,
                               wd);
}

headsum_status AttributionFromBasis(const ProjDims& p, const float* heads, const float* wd,
                                    size_t n_directions, float* out) {
  return AttributionThroughBasis(TableIndex(ActiveTarget()), p, heads, wd, n_directions, out);
}

headsum_status HeadAttribution(const ProjDims& p, const float* heads, const float* wo,
                               const float* directions, size_t n_directions, float* out) {
  const size_t t = TableIndex(ActiveTarget());
  // wd = Wo[h] directions^T as [H][R][L], once per call; then O(L R) per (s, h).
  hwy::AlignedFreeUniquePtr<float[]> wd = AllocateFloats(p.inner() * n_directions);
  if (!wd) return HEADSUM_ERR_OUT_OF_MEMORY;
  if (headsum_status s = WeightsOntoDirections(t, p, wo, directions, n_directions, wd.get())) {
    return s;
  }
  return AttributionThroughBasis(t, p, heads, wd.get(), n_directions, out);
}

}  // namespace dispatch

namespace testing {
size_t ProjectionDecodeHeadsPerGroup(size_t batch, size_t seq, size_t heads, size_t head_dim,
                                     size_t model_dim, size_t wo_bytes) {
  return dispatch::DecodeHeadsPerGroup({batch, seq, heads, head_dim, model_dim}, wo_bytes);
}
}  // namespace testing
}  // namespace headsum
#endif  // HWY_ONCE
