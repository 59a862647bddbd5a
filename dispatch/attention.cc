// The fused attention: plans a call (native bf16 path, grouped decode,
// head packing or key splits, whether K/V come from memory) and runs its
// blocks of query rows on the paths the table of dispatch/attention_paths.cc
// picks.  Compiled once; the kernels are in dispatch/attention_*.cc.
#include <algorithm>
#include <atomic>
#include <vector>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "dispatch/attention_paths.h"
#include "dispatch/native_ops.h"
#include "dispatch/ops.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"
#include "dispatch/test_hooks.h"
#include "hwy/aligned_allocator.h"
#include "hwy/base.h"

namespace headsum {
namespace dispatch {
namespace {

constexpr size_t kKeySplit = kAttentionKeySplit;

// The last-level cache of this CPU (sysconf), or 0 when it does not say.
size_t LastLevelCacheBytes() {
  static const size_t bytes = [] {
    long r = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (r <= 0) r = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return r > 0 ? static_cast<size_t>(r) : size_t{0};
  }();
  return bytes;
}

// Whether a call's K and V are likely read from memory rather than from the
// last-level cache: their bytes against half the cache that sysconf
// reports, that bound at most 16 MiB (a tenant may get much less of a
// shared L3 than lscpu says: on some machines of this kind a 134 MB K/V
// streams at DRAM rate under a reported 480 MB).  The dot paths prefetch
// K/V rows only then: measured on Zen 5 (32 MiB L3), a bf16 decode step over
// 8.4 MB of cache-resident K/V took 116-122 us without software prefetch and
// 143-152 us with it, while from DRAM (H=32 L=128 Skv=32768, 512 MiB) the
// prefetch is what keeps the step at the read bandwidth (18-19 ms with it,
// 25-28 ms without).
// (testing::SetKvInCacheBytes overrides the threshold.)
bool KvBytesFromMemory(size_t bytes) {
  const size_t set = KvInCacheBytes();
  if (set != testing::kKvInCacheAuto) return bytes > set;
  const size_t cache = LastLevelCacheBytes();
  return cache == 0 || bytes > HWY_MIN(cache / 2, size_t{16} << 20);
}
bool KvFromMemory(const AttnDims& a, const AttnViews& views) {
  return KvBytesFromMemory(a.batch * a.kv_heads * a.seq_kv * a.head_dim *
                           (DTypeBytes(views.k.dtype) + DTypeBytes(views.v.dtype)));
}

// How a one-row decode over 16-bit K/V from memory (f32 K/V too, where it
// is key by key: see RowStreams) runs on this CPU: on
// the 512-key tiles of FlashAttentionRowByDot, or on FlashAttentionRowStream
// (AttnDims::row_stream) scoring keys eight at a time with software prefetch
// or one at a time without (AttnDims::stream_key_by_key).
//  - Intel: the stream, eight keys at a time.  Tuned on the Sapphire Rapids
//    VM, where it beat the 512-key tiles (H=32 L=128 Skv=32768, one thread:
//    bf16 45.0 -> 39.1 ms, f16 44.0 -> 40.9; see the kernel).
//  - AMD: the stream, key by key.  On a Zen 4 VM (AMD EPYC, AVX-512, 1 MiB
//    L2, 32 MiB L3) the eight-key stream was the slower by far (one thread f16 41.6-44.5 ms against 29.0-33.1 with the tiles, bf16
//    47.3-50.6 against 29.4-30.2), and every prefetch distance and hint
//    left it there.  What held it back was the eight-key groups and the
//    prefetches: a copy of the kernel on one 64 MB bf16 K and V stream, no
//    software prefetch, read them in 45-51 ns a key with eight-key groups,
//    17-20 ns one key at a time (f16 39-43 -> 17-20), and in the library
//    one key at a time took 31-53 ns with the prefetches, 20-23 without
//   .  In the library (H=32 L=128 Skv=32768,
//    medians of 5, 3 rounds alternated): one thread f16 28.3-31.7 ns a key
//    and head on the tiles -> 21.5-26.4 key by key, bf16 30.4-32.0 ->
//    22.4-22.6; two threads f16 17.4-22.5 -> 12.9-18.8, bf16 17.9-21.7 ->
//    13.8-18.0.  f32 K/V key by key as well (before, the
//    512-key tiles or their aligned-frame form): one thread, 16 bytes off,
//    4 rounds alternated, medians of 7: 45.7-51.2 -> 42.6-47.7 ns a key and
//    head (faster in all 4); 64-byte aligned 52.3-56.3 -> 48.4-54.2 (all 3).
//  - On the x86 targets with 16 registers (AVX2, SSE4, SSSE3) either
//    stream is FlashAttentionRowStreamNarrow: key by key, with the
//    prefetch.  On a Zen 3 VM (AMD EPYC, AVX2 only, 512 KiB L2; H=32 L=128
//    Skv=32768, 16 bytes off, medians of 7 alternated) against the tiles:
//    one thread f16 36.1 -> 29.5 ms, bf16 39.3 -> 32.1, f32 91.4 -> 72.0;
//    two threads f16 19.1 -> 15.7, bf16 20.7 -> 16.4, f32 41.1 -> 35.8;
//    SSE4 forced there, one thread: bf16 58.3 -> 43.8, f32 99.3 -> 70.6,
//    f16 (widened by integer ops: compute-bound) 146.7 -> 138.4.
//  - Other x86 CPUs: the tiles (neither stream measured there).
//  - Other architectures: the stream, eight keys at a time, as before (not
//    measured on Arm hardware).
enum class RowStreamKind { kTiles, kEightKeys, kKeyByKey };

RowStreamKind RowStreamFor() {
  static const RowStreamKind preferred = [] {
#if defined(__x86_64__) || defined(__i386__)
    switch (Vendor()) {
      case CpuVendor::kIntel: return RowStreamKind::kEightKeys;
      case CpuVendor::kAmd: return RowStreamKind::kKeyByKey;
      default: return RowStreamKind::kTiles;
    }
#else
    return RowStreamKind::kEightKeys;
#endif
  }();
  switch (RowStreamMode()) {
    case 0: return RowStreamKind::kTiles;
    case 1: return RowStreamKind::kEightKeys;
    case 2: return RowStreamKind::kKeyByKey;
    default: return preferred;
  }
}

}  // namespace

headsum_status Attention(const AttnDims& a, const float* q, const float* k, const float* v,
                         float* out) {
  AttnViews views;
  views.q = ContiguousF32(q, a.heads, a.seq_q, a.head_dim);
  views.k = ContiguousF32(k, a.kv_heads, a.seq_kv, a.head_dim);
  views.v = ContiguousF32(v, a.kv_heads, a.seq_kv, a.head_dim);
  views.out = ContiguousF32(out, a.heads, a.seq_q, a.head_dim);
  return Attention(a, views);
}

headsum_status Attention(const AttnDims& dims, const AttnViews& views) {
  AttnDims a = dims;
  a.prefetch_kv = KvFromMemory(dims, views);
  const RowStreamKind stream = RowStreamFor();
  a.row_stream = stream != RowStreamKind::kTiles;
  a.stream_key_by_key = stream == RowStreamKind::kKeyByKey;
  // bf16 inputs (or any, under fpmath BF16) on a native bf16 path in force.
  // (Except few rows of bf16 on AMX_BF16: NativeFewRowsOnF32.)
  // (Calls with a model's extras or a window run on the Highway paths
  // where the native path does not take them.)
  const bool plain = a.opt == nullptr && a.window == 0;
  if (const native::Path* n = NativeFor({views.q.dtype, views.k.dtype, views.v.dtype})) {
    if ((plain || n->takes_options) && !NativeFewRowsOnF32(*n, a, views)) {
      return NativeAttention(*n, a, views);
    }
  }
  // A decode step (Sq = 1) of grouped heads: each group one head of
  // H/Hkv rows, all of which see the same keys.
  if (a.seq_q == 1 && a.group() > 1) {
    AttnDims grouped;
    AttnViews g;
    AttnOptions grouped_opt;
    GroupDecodeHeads(a, views, &grouped, &g, &grouped_opt);
    return Attention(grouped, g);
  }
  const AttnTarget t = AttnTargetOf(ActiveTarget());
  const size_t scratch = attn::ScratchFloats(t.index, a, views);
  const RowBlocks blocks{a, kAttentionQueryBlock};
  // Keys [keys_lo, keys_hi) are all the call's rows see (all keys but under
  // a sliding window): a decode step splits those.
  const size_t keys_lo = a.first_key(0), keys_hi = a.visible_keys(a.seq_q - 1);
  const size_t span = keys_hi > keys_lo ? keys_hi - keys_lo : 0;
  const size_t splits = a.seq_q <= kAttentionQueryBlock && span >= 2 * kKeySplit
                            ? (span + kKeySplit - 1) / kKeySplit : 1;
  if (splits == 1 && attn::HeadPackFloats(t.index, a, views) != 0) {
    // Token-major or 16-bit K/V: each thread copies a head's rows once (see
    // kernels/attention/head_pack-inl.h); `call` tells this call's copies
    // from those a previous call left in the reused scratch.
    static std::atomic<uint64_t> calls{0};
    const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
    // Work items: the first heads whole (every query block of a head on the
    // thread that copied its rows: one copy a head), then the last
    // `threads` heads' worth block by block (each thread that runs a block
    // of such a head copies it), so that threads running at different
    // speeds still finish together.  (Items of single blocks throughout had
    // both threads copy every head on two threads.  Token-major f32 H=8
    // L=64 S=512, alternated in one process on a Zen 3 VM, two threads,
    // medians of 31 rounds, speed against the contiguous call: causal
    // 0.934 / 0.948 -> 0.969 / 0.978, not causal 0.996 / 0.994 -> 1.010 /
    // 1.019; H=5 causal 0.951 -> 0.968, H=12 0.964 -> 0.985; S=2048 and one
    // thread unchanged.  The bits do not depend on which thread runs a
    // block.)
    const size_t per_head = blocks.per_head(), heads = a.batch * a.heads;
    const size_t threads = static_cast<size_t>(NumThreads());
    const size_t whole = heads / threads > 1 ? (heads / threads - 1) * threads : 0;
    return ParallelItems(whole + (heads - whole) * per_head,
                         attn::HeadPackedScratchFloats(t.index, a, views),
                         [&](size_t item, float* scratch) {
                           const auto run = [&](size_t b, size_t h, size_t i0, size_t i1) {
                             AttnViews packed;
                             attn::PackHeadViews(t.index, a, views, b, h, call, scratch, &packed);
                             RunAttentionBlock(t, a, packed, b, h, i0, i1, 0, a.seq_kv, nullptr,
                                               scratch);
                           };
                           if (item < whole) {
                             for (size_t i = 0; i < per_head; ++i) {
                               blocks.Run(item * per_head + i, run);
                             }
                           } else {
                             blocks.Run(whole * per_head + (item - whole), run);
                           }
                         });
  }
  if (splits == 1) {
    return ParallelItems(blocks.count(), scratch, [&](size_t item, float* scratch) {
      blocks.Run(item, [&](size_t b, size_t h, size_t i0, size_t i1) {
        RunAttentionBlock(t, a, views, b, h, i0, i1, 0, a.seq_kv, nullptr, scratch);
      });
    });
  }
  // One query block per head: split its keys, then merge the partials in
  // key order.  partials: [B*H][splits][Sq][L + 2].
  const size_t per_split = a.seq_q * (a.head_dim + 2);
  hwy::AlignedFreeUniquePtr<float[]> fresh;
  float* const partials =
      CallBuffer(CachedBuffer::kPartials, a.batch * a.heads * splits * per_split, &fresh);
  if (partials == nullptr) return HEADSUM_ERR_OUT_OF_MEMORY;
  // Items run kv head by kv head, split by split, and the query heads that
  // share a kv head (GQA, MQA) next to each other: a split's keys and values
  // come from L3 once and from L2 for the other heads of the group.
  const size_t heads = a.batch * a.heads, group = a.group();
  if (headsum_status s = ParallelItems(heads * splits, scratch, [&](size_t item, float* scratch) {
        const size_t in_group = item % group, c = (item / group) % splits;
        const size_t bg = item / (group * splits);  // b * kv_heads + g
        const size_t b = bg / a.kv_heads, h = (bg % a.kv_heads) * group + in_group;
        const size_t bh = b * a.heads + h;
        const size_t key_end = HWY_MIN(keys_lo + (c + 1) * kKeySplit, a.seq_kv);
        RunAttentionBlock(t, a, views, b, h, 0, a.seq_q, keys_lo + c * kKeySplit, key_end,
                          partials + (bh * splits + c) * per_split, scratch);
      })) {
    return s;
  }
  return ParallelItems(heads, attn::MergeScratchFloats(t.index, a),
                       [&](size_t bh, float* scratch) {
                         attn::MergeKeySplits(t.index, a, partials + bh * splits * per_split,
                                              splits, views.out, bh / a.heads, bh % a.heads, 0,
                                              a.seq_q, scratch);
                       });
}

namespace {

// One sequence of a paged call as a dense call of batch 1 (grouped heads
// for a GQA decode step), and where its work items and partials start.
struct PagedSeq {
  AttnDims a;
  AttnViews views;
  AttnOptions opt, grouped_opt;
  size_t keys_lo, splits, blocks;  // key range start, key splits, row blocks a head
  bool pack;                        // a prefill whose heads' rows are copied once (head_pack)
  size_t partials;                  // its first partial record's offset (splits > 1)
};

// A work item: row block `block` of head h of sequence seq, key split c.
struct PagedItem {
  uint32_t seq, h, block, c;
  uint64_t cost;  // rows x keys, to hand the longest out first
};

}  // namespace

headsum_status AttentionPaged(const PagedBatch& p, size_t window, const AttnOptions* opt,
                              const TensorView& q, const TensorView& out) {
  // Kept per thread between calls (grow-only): no allocation once warm.
  // (Named through references: the threads' lambdas below must see the
  // calling thread's vectors, not their own thread_local ones.)
  thread_local std::vector<PagedSeq> kept_seqs;
  thread_local std::vector<PagedItem> kept_items;
  std::vector<PagedSeq>& seqs = kept_seqs;
  std::vector<PagedItem>& items = kept_items;
  seqs.clear();
  seqs.reserve(p.batch);  // a.opt points into seqs' elements: no reallocation below
  items.clear();
  size_t kv_bytes = 0;
  for (size_t b = 0; b < p.batch; ++b) {
    kv_bytes += static_cast<size_t>(p.kv_lens[b]) * p.kv_heads * p.head_dim *
                (DTypeBytes(p.k.dtype) + DTypeBytes(p.v.dtype));
  }
  const bool from_memory = KvBytesFromMemory(kv_bytes);
  const RowStreamKind stream = RowStreamFor();
  const AttnTarget t = AttnTargetOf(ActiveTarget());
  size_t scratch = 0, partial_floats = 0;
  for (size_t b = 0; b < p.batch; ++b) {
    const size_t rows = static_cast<size_t>(p.q_offsets[b + 1] - p.q_offsets[b]);
    if (rows == 0) continue;
    seqs.emplace_back();
    PagedSeq& s = seqs.back();
    AttnDims& a = s.a;
    a = AttnDims{};
    a.batch = 1;
    a.heads = p.heads;
    a.kv_heads = p.kv_heads;
    a.seq_q = rows;
    a.seq_kv = static_cast<size_t>(p.kv_lens[b]);
    a.head_dim = p.head_dim;
    a.scale = p.scale;
    a.causal = p.causal;
    a.window = window;
    a.prefetch_kv = from_memory;
    a.row_stream = stream != RowStreamKind::kTiles;
    a.stream_key_by_key = stream == RowStreamKind::kKeyByKey;
    if (opt != nullptr) {  // the bias's rows of this sequence: [b][h][i][j]
      s.opt = *opt;
      s.opt.bias.data = s.opt.has_bias ? s.opt.bias.Row(b, 0, 0) : nullptr;
      s.opt.bias.sb = 0;
      a.opt = &s.opt;
    }
    AttnViews& v = s.views;
    v.q = q;
    v.q.data = q.Row(0, 0, static_cast<size_t>(p.q_offsets[b]));
    v.out = out;
    v.out.data = out.Row(0, 0, static_cast<size_t>(p.q_offsets[b]));
    v.k = p.k;
    v.v = p.v;
    v.pages = KvPages{p.block_table + b * p.blocks_per_seq, p.block_rows, p.block_stride};
    if (rows == 1 && a.group() > 1) {
      AttnDims grouped;
      AttnViews g;
      GroupDecodeHeads(a, v, &grouped, &g, &s.grouped_opt);
      if (grouped.opt != nullptr) grouped.opt = &s.grouped_opt;
      a = grouped;
      v = g;
    }
    s.keys_lo = a.first_key(0);
    const size_t keys_hi = a.visible_keys(a.seq_q - 1);
    const size_t span = keys_hi > s.keys_lo ? keys_hi - s.keys_lo : 0;
    s.splits = a.seq_q <= kAttentionQueryBlock && span >= 2 * kKeySplit
                   ? (span + kKeySplit - 1) / kKeySplit : 1;
    s.blocks = (a.seq_q + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
    s.partials = partial_floats;
    if (s.splits > 1) partial_floats += a.heads * s.splits * a.seq_q * (a.head_dim + 2);
    scratch = HWY_MAX(scratch, attn::ScratchFloats(t.index, a, v));
    const uint32_t seq = static_cast<uint32_t>(seqs.size() - 1);
    // A prefill of several query blocks a head: each item a whole head,
    // whose K/V rows the thread copies once from their blocks, contiguous,
    // for all its query blocks (as a dense call over token-major rows does:
    // kernels/attention/head_pack-inl.h; each block re-gathering its tiles,
    // or reading the blocks' strided rows in place, ran a ragged prefill at
    // 0.73x the speed of dense calls per sequence).
    s.pack = s.splits == 1 && attn::HeadPackFloats(t.index, a, v) != 0;
    if (s.pack) {
      scratch = HWY_MAX(scratch, attn::HeadPackedScratchFloats(t.index, a, v));
      const uint64_t cost = static_cast<uint64_t>(a.seq_q) * a.seq_kv;
      for (size_t h = 0; h < a.heads; ++h) {
        items.push_back(PagedItem{seq, static_cast<uint32_t>(h), 0, 0, cost});
      }
      continue;
    }
    for (size_t h = 0; h < a.heads; ++h) {
      for (size_t blk = 0; blk < s.blocks; ++blk) {
        const size_t i1 = HWY_MIN(a.seq_q, (blk + 1) * kAttentionQueryBlock);
        const size_t keys = HWY_MIN(a.visible_keys(i1 - 1), span) / s.splits + 1;
        for (size_t c = 0; c < s.splits; ++c) {
          items.push_back(PagedItem{seq, static_cast<uint32_t>(h), static_cast<uint32_t>(blk),
                                    static_cast<uint32_t>(c),
                                    static_cast<uint64_t>(i1 - blk * kAttentionQueryBlock) * keys});
        }
      }
    }
  }
  // Longest first, so that threads over sequences of very different
  // lengths finish together (the bits do not depend on the order).
  std::stable_sort(items.begin(), items.end(),
                   [](const PagedItem& x, const PagedItem& y) { return x.cost > y.cost; });
  hwy::AlignedFreeUniquePtr<float[]> fresh;
  float* partials = nullptr;
  if (partial_floats != 0) {
    partials = CallBuffer(CachedBuffer::kPartials, partial_floats, &fresh);
    if (partials == nullptr) return HEADSUM_ERR_OUT_OF_MEMORY;
  }
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  if (headsum_status st = ParallelItems(items.size(), scratch, [&](size_t n, float* scratch) {
        const PagedItem& it = items[n];
        const PagedSeq& s = seqs[it.seq];
        const AttnDims& a = s.a;
        if (s.pack) {  // (the views' batch strides are 0: b is the sequence, for the tag)
          AttnViews packed;
          attn::PackHeadViews(t.index, a, s.views, it.seq, it.h, call, scratch, &packed);
          for (size_t blk = s.blocks; blk-- > 0;) {  // the causal diagonal's longest first
            const size_t i0 = blk * kAttentionQueryBlock;
            RunAttentionBlock(t, a, packed, it.seq, it.h, i0,
                              HWY_MIN(a.seq_q, i0 + kAttentionQueryBlock), 0, a.seq_kv, nullptr,
                              scratch);
          }
          return;
        }
        const size_t i0 = it.block * kAttentionQueryBlock;
        const size_t i1 = HWY_MIN(a.seq_q, i0 + kAttentionQueryBlock);
        if (s.splits == 1) {
          RunAttentionBlock(t, a, s.views, 0, it.h, i0, i1, 0, a.seq_kv, nullptr, scratch);
          return;
        }
        const size_t per_split = a.seq_q * (a.head_dim + 2);
        const size_t key_begin = s.keys_lo + it.c * kKeySplit;
        const size_t key_end = HWY_MIN(key_begin + kKeySplit, a.seq_kv);
        RunAttentionBlock(t, a, s.views, 0, it.h, 0, a.seq_q, key_begin, key_end,
                          partials + s.partials + (it.h * s.splits + it.c) * per_split,
                          scratch);
      })) {
    return st;
  }
  if (partial_floats == 0) return HEADSUM_OK;
  // The split heads' partials merged in key order.
  items.clear();
  for (size_t n = 0; n < seqs.size(); ++n) {
    if (seqs[n].splits == 1) continue;
    for (size_t h = 0; h < seqs[n].a.heads; ++h) {
      items.push_back(PagedItem{static_cast<uint32_t>(n), static_cast<uint32_t>(h), 0, 0, 0});
    }
  }
  return ParallelItems(items.size(), attn::MergeScratchFloats(t.index, seqs[0].a),
                       [&](size_t n, float* scratch) {
                         const PagedSeq& s = seqs[items[n].seq];
                         const size_t per_split = s.a.seq_q * (s.a.head_dim + 2);
                         attn::MergeKeySplits(t.index, s.a,
                                              partials + s.partials +
                                                  items[n].h * s.splits * per_split,
                                              s.splits, s.views.out, 0, items[n].h, 0,
                                              s.a.seq_q, scratch);
                       });
}

}  // namespace dispatch
}  // namespace headsum
