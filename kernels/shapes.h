// Non-SIMD shape types shared by dispatch/ and kernels/: the public shapes
// with defaults resolved (kv_heads, scale) and sizes as size_t.  Built only
// after validation, so every product here is known not to overflow.
#ifndef HEADSUM_KERNELS_SHAPES_H_
#define HEADSUM_KERNELS_SHAPES_H_

#include <cstddef>
#include <cstdint>

namespace headsum {

// Element types of the tensor API (headsum_dtype's values).
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline size_t DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// A validated strided view (headsum_tensor): element (b, h, s, l) at
// data + (b*sb + h*sh + s*ss + l) elements of `dtype`.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  size_t sb = 0, sh = 0, ss = 0;
  // Byte address of element (b, h, s, 0).
  char* Row(size_t b, size_t h, size_t s) const {
    return static_cast<char*>(data) + (b * sb + h * sh + s * ss) * DTypeBytes(dtype);
  }
  bool IsF32() const { return dtype == DType::kF32; }
};

// What a model adds to the scores (headsum_attn_options, validated), as the
// kernels apply it: per score s = scale q.k, then s = softcap tanh(s /
// softcap), s += slopes[h] (j - p), s += bias[b][h][i][j]; the row's
// denominator adds exp(sinks[h] - m).  The window is AttnDims::window.
struct AttnOptions {
  float softcap = 0.0f;            // 0: none
  const float* slopes = nullptr;   // [H] of the call's heads, or null
  const float* sinks = nullptr;    // [H], or null
  bool has_bias = false;
  TensorView bias;                 // [b][h][i] rows of keys (j contiguous)
  // Whether anything is added to the scores themselves (the paths that
  // take it: dispatch/attention_paths.cc).
  bool Scores() const { return softcap > 0.0f || slopes != nullptr || has_bias; }
};

struct AttnDims {
  size_t batch, heads, kv_heads;  // kv_heads divides heads
  size_t seq_q, seq_kv, head_dim;
  float scale;                    // resolved: 0 in the public shape became 1/sqrt(L)
  bool causal;
  // Whether the dot paths prefetch K/V rows ahead (dispatch clears it where
  // the call's K/V fit well inside the last-level cache; see KvFromMemory).
  bool prefetch_kv = true;
  // Whether a one-row decode over 16-bit K/V read from memory may run on
  // FlashAttentionRowStream (K and V side by side in 16-key tiles, q and the
  // accumulator in registers) rather than on 512-key tiles of K, then V
  // (dispatch decides per CPU; see RowStreamFor).
  bool row_stream = true;
  // How FlashAttentionRowStream scores a tile's keys: false, eight at a
  // time (their dot products reduced together) with the K and V rows
  // prefetched kStreamAhead keys on; true, one key at a time (each dot
  // product reduced on its own) with no software prefetch, the hardware
  // prefetchers left to follow the two streams (dispatch decides per CPU;
  // see RowStreamFor).  Key by key, f32 K/V from memory stream too.
  bool stream_key_by_key = false;

  // The sliding window (0: none): causal rows at position p see keys
  // p - window < j <= p, other rows |j - p| < window.
  size_t window = 0;
  // What the model adds to the scores and the denominators (null: nothing).
  const AttnOptions* opt = nullptr;
  // > 0: the rows of head h are query heads h * rows_are_heads + i of one
  // decode step (GroupDecodeHeads), all at position seq_kv - 1.
  size_t rows_are_heads = 0;

  size_t group() const { return heads / kv_heads; }  // query heads per kv head
  // Bottom-right aligned causal mask: query i sees key j when j <= i + offset.
  long long causal_offset() const {
    return static_cast<long long>(seq_kv) - static_cast<long long>(seq_q);
  }
  // The position of query row i (keys sit at 0 .. seq_kv - 1).
  long long position(size_t i) const {
    return rows_are_heads != 0 ? static_cast<long long>(seq_kv) - 1
                               : static_cast<long long>(i) + causal_offset();
  }
  // The query head of row i of head h (for the slopes and sinks).
  size_t query_head(size_t h, size_t i) const {
    return rows_are_heads != 0 ? h * rows_are_heads + i : h;
  }
  // Keys [first_key(i), visible_keys(i)) are the ones query row i sees.
  size_t visible_keys(size_t i) const {
    if (!causal && window == 0) return seq_kv;
    const long long p = position(i);
    const long long end = causal ? p + 1 : p + static_cast<long long>(window);
    if (end <= 0) return 0;
    return static_cast<size_t>(end) < seq_kv ? static_cast<size_t>(end) : seq_kv;
  }
  size_t first_key(size_t i) const {
    if (window == 0) return 0;
    const long long first = position(i) - static_cast<long long>(window) + 1;
    if (first <= 0) return 0;
    return static_cast<size_t>(first) < seq_kv ? static_cast<size_t>(first) : seq_kv;
  }
};

struct ProjDims {
  size_t batch, seq, heads, head_dim, model_dim;
  // A decode step's Wo was read by the call before and fits the threads'
  // L2s, so is likely still there (dispatch/projection.cc): a one-row sweep
  // of a 16-bit Wo then reads two rows a pass, else one (RowSweep).  Never
  // changes the result.
  bool wo_recent = false;
  size_t inner() const { return heads * head_dim; }  // rows of Wo
};

// Operands of the projection; y and per_head may each be null (not both).
struct ProjectArgs {
  const float* heads;       // O [B][H][S][L]
  const float* wo;          // [H*L][D]
  const float* bias;        // [D] or nullptr
  const float* head_gates;  // [H] or nullptr (all 1)
  float* y;                 // [B][S][D] or nullptr
  float* per_head;          // [B][S][H][D] or nullptr
};

// Packed Wo (headsum_wo_pack): the columns of Wo in panels of kWoPanelCols
// (the last panel holds the D % kWoPanelCols left over), each panel stored
// as [H*L][width] contiguously, panel j at offset j * kWoPanelCols * H * L.
// A panel is one column strip of the projection's register tile on
// AVX-512 (3 vectors) and a whole number of tiles on every other target, so
// the layout does not depend on the target that packed it.
constexpr size_t kWoPanelCols = 48;
inline size_t WoPanels(size_t model_dim) {
  return (model_dim + kWoPanelCols - 1) / kWoPanelCols;
}

// A paged K/V (headsum_paged_kv) as the kernels read one sequence's keys:
// key j of kv head g at k.Row(0, g, 0) + (table[j / rows] * stride + (j %
// rows) * k.ss) elements (table null: not paged).
struct KvPages {
  const int32_t* table = nullptr;  // the sequence's blocks
  size_t rows = 0;                 // tokens per block
  size_t stride = 0;               // elements between blocks
};

// The operands of attention on views: q [B][H][Sq][L], k and v
// [B][Hkv][Skv][L], out [B][H][Sq][L]; k and v of a paged cache read
// through `pages`.
struct AttnViews {
  TensorView q, k, v, out;
  KvPages pages;
};

// Contiguous f32 [B][H][S][L] as a view.
inline TensorView ContiguousF32(const float* data, size_t heads, size_t seq, size_t dim) {
  TensorView t;
  t.data = const_cast<float*>(data);
  t.dtype = DType::kF32;
  t.sb = heads * seq * dim;
  t.sh = seq * dim;
  t.ss = dim;
  return t;
}

// Rows of Y per work item of the projection's chained sum (ChainTile), which
// sizes its scratch by it.
constexpr size_t kChainRows = 64;

// Query rows of one fused-attention work item: the dispatcher splits by it
// and the kernel sizes its scratch by it.  Enough rows to reuse each packed
// K^T tile many times.
constexpr size_t kAttentionQueryBlock = 64;
// Blocks of up to this many query rows run each row alone on dot products
// (kernels/attention/decode_rows-inl.h): a block of vectors along the
// queries would be mostly padding.
constexpr size_t kAttentionDotRows = 3;
// Rows per group of the grouped decode path (decode_groups-inl.h).
constexpr size_t kAttentionGroupRows = 4;
// Keys per split when one query block cannot keep the threads busy
// (decode): a fixed length, so the split, and with it the result, depends
// on the shape alone, never on the thread count.
constexpr size_t kAttentionKeySplit = 512;

}  // namespace headsum

#endif  // HEADSUM_KERNELS_SHAPES_H_
