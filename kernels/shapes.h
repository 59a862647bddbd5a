// Non-SIMD shape types shared by dispatch/ and kernels/: the public shapes
// with defaults resolved (kv_heads, scale) and sizes as size_t.  Built only
// after validation, so every product here is known not to overflow.
#ifndef HEADSUM_KERNELS_SHAPES_H_
#define HEADSUM_KERNELS_SHAPES_H_

#include <cstddef>

namespace headsum {

struct AttnDims {
  size_t batch, heads, kv_heads;  // kv_heads divides heads
  size_t seq_q, seq_kv, head_dim;
  float scale;                    // resolved: 0 in the public shape became 1/sqrt(L)
  bool causal;

  size_t group() const { return heads / kv_heads; }  // query heads per kv head
  // Bottom-right aligned causal mask: query i sees key j when j <= i + offset.
  long long causal_offset() const {
    return static_cast<long long>(seq_kv) - static_cast<long long>(seq_q);
  }
  // Number of keys query row i sees (0 .. seq_kv).
  size_t visible_keys(size_t i) const {
    if (!causal) return seq_kv;
    const long long last = static_cast<long long>(i) + causal_offset();
    if (last < 0) return 0;
    const size_t n = static_cast<size_t>(last) + 1;
    return n < seq_kv ? n : seq_kv;
  }
};

struct ProjDims {
  size_t batch, seq, heads, head_dim, model_dim;
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

// Query rows of one fused-attention work item: the dispatcher splits by it
// and the kernel sizes its scratch by it.  Enough rows to reuse each packed
// K^T tile many times.
constexpr size_t kAttentionQueryBlock = 64;

}  // namespace headsum

#endif  // HEADSUM_KERNELS_SHAPES_H_
