// An independent double-precision reference for every headsum kernel.
// Shares no code with kernels/: plain loops over the layouts of headsum.h,
// written the textbook way (the projection concatenates the heads, then does
// one GEMM).  Inputs are f32 as the kernels see them; all arithmetic is in
// double, so its own error (~1e-16 relative) is negligible next to f32's.
#ifndef HEADSUM_TESTS_REFERENCE_H_
#define HEADSUM_TESTS_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "headsum/headsum.h"

namespace headsum_test {

// Attention dims with the public defaults resolved (kv_heads 0 -> heads,
// scale 0 -> 1/sqrt(head_dim), computed in double).
struct RefAttnDims {
  explicit RefAttnDims(const headsum_attn_shape& s);

  int64_t batch, heads, kv_heads, seq_q, seq_kv, head_dim;
  double scale;
  bool causal;
  // What a model adds (headsum_attn_options), each optional: the sliding
  // window, the softcap, ALiBi slopes [H], sinks [H], and the bias as its
  // values expanded to [B][H][Sq][Skv] (as the kernel reads them).
  int64_t window = 0;
  double softcap = 0.0;
  const float* slopes = nullptr;
  const float* sinks = nullptr;
  const std::vector<float>* bias = nullptr;

  // GQA: query head h reads kv head h / (H / Hkv).
  int64_t kv_head_of(int64_t h) const { return h / (heads / kv_heads); }
  // Bottom-right aligned causal mask: query i sees key j when
  // j <= i + (Skv - Sq).
  // A sliding window: causal rows see p - window < j <= p, others |j - p| <
  // window, p = i + (Skv - Sq) the row's position.
  int64_t position(int64_t i) const { return i + (seq_kv - seq_q); }
  bool visible(int64_t i, int64_t j) const {
    const int64_t p = position(i);
    if (causal && j > p) return false;
    if (window > 0) return causal ? j > p - window : (j > p - window && j < p + window);
    return true;
  }

  // Flat indices into Q/O [B][H][Sq][L], K/V [B][Hkv][Skv][L], S [B][H][Sq][Skv].
  size_t q_at(int64_t b, int64_t h, int64_t i, int64_t l) const {
    return size_t(((b * heads + h) * seq_q + i) * head_dim + l);
  }
  size_t kv_at(int64_t b, int64_t g, int64_t j, int64_t l) const {
    return size_t(((b * kv_heads + g) * seq_kv + j) * head_dim + l);
  }
  size_t s_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return size_t(((b * heads + h) * seq_q + i) * seq_kv + j);
  }
  size_t q_elems() const { return size_t(batch * heads * seq_q * head_dim); }
  size_t scores_elems() const { return size_t(batch * heads * seq_q * seq_kv); }
};

// A visible score `scaled` = scale q.k with what the model adds, in order:
// softcap tanh(s / softcap), + slopes[h] (j - p), + bias[b][h][i][j].
double RefScoreWithOptions(const RefAttnDims& d, int64_t b, int64_t h, int64_t i, int64_t j,
                           double scaled);
// S = scale * Q K^T, -inf where causally masked.  [B][H][Sq][Skv]
std::vector<double> RefQkScores(const RefAttnDims& d, const float* q, const float* k);
// P = softmax of each score row over the entries the causal mask lets
// through (whatever the masked entries hold); -inf entries get weight 0; a row
// with nothing left gives all zeros.  [B][H][Sq][Skv]
std::vector<double> RefSoftmaxRows(const RefAttnDims& d, const std::vector<double>& scores);
// O = P V.  [B][H][Sq][L]
std::vector<double> RefProbsTimesV(const RefAttnDims& d, const std::vector<double>& probs,
                                   const float* v);
// O = softmax(S) V for f32 scores as headsum_softmax_v reads them.
std::vector<double> RefSoftmaxV(const RefAttnDims& d, const float* scores, const float* v);
// O = softmax(scale Q K^T + mask) V.
std::vector<double> RefAttention(const RefAttnDims& d, const float* q, const float* k,
                                 const float* v);

struct RefProjDims {
  explicit RefProjDims(const headsum_proj_shape& s);

  int64_t batch, seq, heads, head_dim, model_dim;

  int64_t inner() const { return heads * head_dim; }  // rows of Wo, width of concat
  // O [B][H][S][L]
  size_t o_at(int64_t b, int64_t h, int64_t s, int64_t l) const {
    return size_t(((b * heads + h) * seq + s) * head_dim + l);
  }
  // Wo [H*L][D]: row h*L + l of head h's slice Wo[h]
  size_t wo_at(int64_t h, int64_t l, int64_t dcol) const {
    return size_t((h * head_dim + l) * model_dim + dcol);
  }
  // per-head tensors [B][S][H][X] (X = D for contributions, R or 1 otherwise)
  size_t bsh(int64_t b, int64_t s, int64_t h) const {
    return size_t((b * seq + s) * heads + h);
  }
  size_t y_elems() const { return size_t(batch * seq * model_dim); }
  size_t per_head_elems() const { return size_t(batch * seq * heads * model_dim); }
};

// concat[b][s][h*L + l] = O[b][h][s][l].  [B][S][H*L]
std::vector<double> RefConcatHeads(const RefProjDims& d, const float* heads);
// a [m][k] @ b [k][n], b row-major f32.  [m][n]
std::vector<double> RefMatmul(const std::vector<double>& a, const float* b, int64_t m,
                              int64_t k, int64_t n);
// The textbook projection: Y = concat(O_1..O_H) @ Wo + bias (bias may be NULL).
// [B][S][D]
std::vector<double> RefConcatProject(const RefProjDims& d, const float* heads,
                                     const float* wo, const float* bias);
// Each head's own contribution: c[b][s][h][:] = O_h[b][s][:] @ Wo[h].  [B][S][H][D]
std::vector<double> RefHeadContributions(const RefProjDims& d, const float* heads,
                                         const float* wo);
// y = sum_h g_h c_h + bias (gates NULL means all 1, bias may be NULL).  [B][S][D]
std::vector<double> RefGatedSum(const RefProjDims& d, const std::vector<double>& contributions,
                                const float* gates, const float* bias);
// out[b][s][h][r] = c[b][s][h][:] . directions[r][:].  [B][S][H][R]
std::vector<double> RefAttribution(const RefProjDims& d,
                                   const std::vector<double>& contributions,
                                   const float* directions, int64_t n_directions);
// out[b][s][h] = || c[b][s][h][:] ||_2.  [B][S][H]
std::vector<double> RefContributionNorms(const RefProjDims& d,
                                         const std::vector<double>& contributions);

// ---- The whole layer (headsum_mha_forward) ----------------------------------
//
// x [B][T][Dm] -> qkv = x [Wq Wk Wv] + [bq bk bv] -> rotate-half RoPE on Q and
// K at positions 0..T-1 -> (K, V rounded to the cache dtype when it is 16-bit)
// -> attention, scale 1/sqrt(L), query at position t sees key j when
// !causal or j <= t (and the window), with the options of
// headsum_mha_create_ex -> y = concat(O) Wo + bo.  A shard is a layer of its
// own heads (slopes and sinks: its heads' slice); `bo` is NULL for the
// shards that do not add it.
struct RefLayerSpec {
  int64_t model_dim, heads, kv_heads, head_dim;  // kv_heads resolved (>= 1)
  bool causal;
  double rope_theta;          // 0: no RoPE
  headsum_dtype cache_dtype;  // F16/BF16: K (after RoPE) and V rounded to it
  // The weights as the layer computes with them (a 16-bit weight_dtype: the
  // caller rounds them first): wq [Dm][H*L], wk and wv [Dm][Hkv*L],
  // wo [H*L][Dm]; biases [H*L], [Hkv*L], [Hkv*L], [Dm] or NULL.
  const float *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
  // What the model adds to the scores, as RefAttnDims takes it: the window,
  // the softcap, the slopes and sinks of these heads ([heads] or NULL).
  int64_t window = 0;
  double softcap = 0.0;
  const float* slopes = nullptr;
  const float* sinks = nullptr;

  int64_t fused() const { return heads + 2 * kv_heads; }  // rows of qkv per token
  int64_t group() const { return heads / kv_heads; }
  // qkv [B][T][fused][L]: rows 0..H-1 Q, then K, then V.
  size_t qkv_at(int64_t b, int64_t T, int64_t t, int64_t row, int64_t l) const {
    return size_t(((b * T + t) * fused() + row) * head_dim + l);
  }
};

// x rounded to nearest (ties to even) in `dtype`: F32 as a float, F16 with
// 11 significant bits (subnormals below 2^-14, inf past 65504), BF16 with 8
// (f32's exponent range).  Computed from the exact double, once.
double RefRoundTo(headsum_dtype dtype, double x);
// The exact qkv of x [B][T][Dm] before RoPE.  [B][T][H + 2 Hkv][L]
std::vector<double> RefLayerQkv(const RefLayerSpec& spec, const float* x, int64_t B, int64_t T);
// (cos, sin) of position t's angle for pair i: t * theta^(-2i/L).
void RefRopeAngle(const RefLayerSpec& spec, int64_t t, int64_t i, double* c, double* s);
// Rotate-half on the Q and K rows of qkv (token t at position t), in place:
//   x[i] <- x[i] cos - x[i + L/2] sin,  x[i + L/2] <- x[i + L/2] cos + x[i] sin.
void RefRope(const RefLayerSpec& spec, int64_t B, int64_t T, std::vector<double>* qkv);
// K and V rows of qkv rounded to spec.cache_dtype when it is 16-bit.
void RefRoundKv(const RefLayerSpec& spec, int64_t B, int64_t T, std::vector<double>* qkv);
// The attention of a forward for the queries at positions q0..T-1 over keys
// 0..T-1 (seq_q = T - q0, seq_kv = T), with the spec's options.
RefAttnDims RefLayerAttnDims(const RefLayerSpec& spec, int64_t B, int64_t T, int64_t q0);
// O for the queries at positions q0..T-1 over keys 0..T-1: the scores of
// RefScoreWithOptions, softmax by RefSoftmaxRows (mask, sinks), then P V.
// [B][H][T - q0][L]
std::vector<double> RefLayerAttention(const RefLayerSpec& spec, const std::vector<double>& qkv,
                                      int64_t B, int64_t T, int64_t q0);
// y = concat(O) Wo + bo, O [B][H][rows][L].  [B][rows][Dm]
std::vector<double> RefLayerOutput(const RefLayerSpec& spec, const std::vector<double>& o,
                                   int64_t B, int64_t rows);
// All of it: y for the tokens at positions q0..T-1 of x [B][T][Dm], each
// attending over keys 0..T-1, as a forward with a cache holding tokens
// 0..q0-1 computes them.  [B][T - q0][Dm]
std::vector<double> RefLayerForward(const RefLayerSpec& spec, const float* x, int64_t B,
                                    int64_t T, int64_t q0);

}  // namespace headsum_test

#endif  // HEADSUM_TESTS_REFERENCE_H_
