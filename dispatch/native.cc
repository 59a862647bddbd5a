#include "dispatch/native_ops.h"

#include <cstring>

#include "dispatch/attention_paths.h"
#include "dispatch/targets.h"
#include "dispatch/threads.h"
#include "dispatch/test_hooks.h"

namespace headsum {
namespace dispatch {
namespace {

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Keys per split of a decode step (as dispatch/attention.cc splits them).
constexpr size_t kKeySplit = kAttentionKeySplit;
// Packed-Wo panels per projection work item: each item packs its O rows
// once for this many panels (128 columns).
constexpr size_t kPanelsPerItem = 4;

}  // namespace

bool NativeSlowerThanHighway(const native::Path& path) {
  return std::strcmp(path.name, "AVX512_BF16") == 0 && Vendor() == CpuVendor::kIntel;
}

const native::Path* NativeFor(std::initializer_list<DType> inputs) {
  const native::Path* path = ActiveNative();
  if (path == nullptr || NativeSlowerThanHighway(*path)) return nullptr;
  if (FpMath() == HEADSUM_FPMATH_BF16) return path;
  for (DType t : inputs) {
    if (t != DType::kBF16) return nullptr;
  }
  return path;
}

bool NativeFewRowsOnF32(const native::Path& path, const AttnDims& a, const AttnViews& views) {
  if (std::strcmp(path.name, "AMX_BF16") != 0) return false;
  if (views.q.dtype != DType::kBF16 || views.k.dtype != DType::kBF16 ||
      views.v.dtype != DType::kBF16) {
    return false;
  }
  const size_t rows = a.seq_q == 1 ? a.group() : a.seq_q;
  return rows < native::kAmxMinTileRows;
}

headsum_status NativeAttention(const native::Path& path, const AttnDims& a,
                               const AttnViews& views) {
  // A decode step of grouped heads: the query heads of a kv head as the rows
  // of one head (one head stride apart), so K/V are read once per group.
  if (a.seq_q == 1 && a.group() > 1) {
    AttnDims grouped;
    AttnViews g;
    AttnOptions grouped_opt;
    GroupDecodeHeads(a, views, &grouped, &g, &grouped_opt);
    return NativeAttention(path, grouped, g);
  }
  const size_t scratch = path.attention_scratch(a);
  constexpr size_t kBlock = native::kQueryBlock;
  const size_t per_head = CeilDiv(a.seq_q, kBlock);
  // Keys [keys_lo, keys_hi) are all the call's rows see (all keys but under
  // a sliding window): a decode step splits those.
  const size_t keys_lo = a.first_key(0), keys_hi = a.visible_keys(a.seq_q - 1);
  const size_t span = keys_hi > keys_lo ? keys_hi - keys_lo : 0;
  const size_t splits = a.seq_q <= kBlock && span >= 2 * kKeySplit ? CeilDiv(span, kKeySplit) : 1;
  if (splits == 1) {
    // Most expensive first: under a causal mask the bottom blocks see most.
    return ParallelItems(a.batch * a.heads * per_head, scratch, [&](size_t item, float* s) {
      const size_t bh = item / per_head, blk = per_head - 1 - item % per_head;
      const size_t i0 = blk * kBlock, i1 = i0 + kBlock < a.seq_q ? i0 + kBlock : a.seq_q;
      path.attention_rows(a, views, bh / a.heads, bh % a.heads, i0, i1, 0, a.seq_kv, nullptr,
                          s);
    });
  }
  const size_t per_split = a.seq_q * native::PartialFloats(a);
  hwy::AlignedFreeUniquePtr<float[]> partials =
      AllocateFloats(a.batch * a.heads * splits * per_split);
  if (!partials) return HEADSUM_ERR_OUT_OF_MEMORY;
  const size_t heads = a.batch * a.heads;
  if (headsum_status st = ParallelItems(heads * splits, scratch, [&](size_t item, float* s) {
        const size_t bh = item / splits, c = item % splits;
        const size_t key_begin = keys_lo + c * kKeySplit;
        const size_t key_end = key_begin + kKeySplit < keys_hi ? key_begin + kKeySplit : keys_hi;
        path.attention_rows(a, views, bh / a.heads, bh % a.heads, 0, a.seq_q, key_begin,
                            key_end, partials.get() + item * per_split, s);
      })) {
    return st;
  }
  return ParallelItems(heads, 0, [&](size_t bh, float*) {
    native::MergePartials(a, partials.get() + bh * splits * per_split, splits, views.out,
                          bh / a.heads, bh % a.heads, 0, a.seq_q);
  });
}

hwy::AlignedFreeUniquePtr<float[]> NativePackWo(const native::Path& path, const ProjDims& p,
                                                   const TensorView& wo) {
  const size_t elements = native::PackedWoElements(p);
  // From AllocateFloats, like all the library's memory (tests make it fail).
  hwy::AlignedFreeUniquePtr<float[]> packed = AllocateFloats((elements + 1) / 2);
  if (!packed) return packed;
  uint16_t* dst = reinterpret_cast<uint16_t*>(packed.get());
  const size_t panels = native::Panels(p);
  if (ParallelItems(CeilDiv(panels, kPanelsPerItem), 0, [&](size_t item, float*) {
        const size_t p0 = item * kPanelsPerItem;
        path.pack_wo(p, wo, dst, p0, p0 + kPanelsPerItem < panels ? p0 + kPanelsPerItem
                                                                           : panels);
      }) != HEADSUM_OK) {
    packed.reset();
  }
  return packed;
}

headsum_status NativeProjection(const native::Path& path, const ProjDims& p,
                                const TensorView& heads, const TensorView* wo,
                                const uint16_t* packed, const float* bias, const TensorView& y) {
  hwy::AlignedFreeUniquePtr<float[]> per_call;
  if (wo != nullptr) {
    per_call = NativePackWo(path, p, *wo);
    if (!per_call) return HEADSUM_ERR_OUT_OF_MEMORY;
    packed = reinterpret_cast<const uint16_t*>(per_call.get());
  }
  const size_t row_blocks = CeilDiv(p.seq, native::kProjRows);
  const size_t panels = native::Panels(p), groups = CeilDiv(panels, kPanelsPerItem);
  const size_t row_items = p.batch * row_blocks;
  return ParallelItems(groups * row_items, path.project_scratch(p), [&](size_t item, float* s) {
    const size_t g = item / row_items, b = item % row_items / row_blocks;
    const size_t s0 = item % row_blocks * native::kProjRows;
    const size_t s1 = s0 + native::kProjRows < p.seq ? s0 + native::kProjRows : p.seq;
    const size_t p0 = g * kPanelsPerItem, p1 = p0 + kPanelsPerItem < panels ? p0 + kPanelsPerItem
                                                                            : panels;
    path.project_rows(p, heads, packed, bias, y, b, s0, s1, p0, p1, s);
  });
}

}  // namespace dispatch
}  // namespace headsum
