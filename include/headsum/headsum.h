/* headsum: SIMD kernels for multi-head attention on CPUs.
 *
 * Multi-head attention read as an addition machine:
 *   Y = concat(O_1..O_H) @ Wo + b  ==  sum_h O_h @ Wo[h] + b,
 * where Wo[h] is rows h*L .. h*L+L-1 of Wo.  Every kernel is compiled for
 * every Highway target and chosen at run time by CPU feature.
 *
 * Layouts (row-major, contiguous, f32):
 *   Q      [B][H][Sq][L]        K, V  [B][Hkv][Skv][L]   (Hkv divides H)
 *   S      [B][H][Sq][Skv]      O     [B][H][Sq][L]
 *   Wo     [H*L][D]             Y     [B][S][D]
 * Causal masking is bottom-right aligned: query i sees key j when
 * j <= i + (Skv - Sq).  scale = 0 means 1/sqrt(L).
 *
 * Every call checks its arguments first; on failure it returns a status,
 * headsum_last_error() (thread-local) names the argument and its value, and
 * no output is written. */
#ifndef HEADSUM_HEADSUM_H_
#define HEADSUM_HEADSUM_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  HEADSUM_OK = 0,
  HEADSUM_ERR_INVALID_ARGUMENT = 1, /* null pointer, dim < 1, H % Hkv != 0, overflow... */
  HEADSUM_ERR_UNSUPPORTED = 2,      /* valid, but this build or CPU cannot serve it */
  HEADSUM_ERR_OUT_OF_MEMORY = 3,
  HEADSUM_ERR_INTERNAL = 4
} headsum_status;

typedef struct {
  int64_t batch, heads, kv_heads; /* kv_heads 0 means = heads */
  int64_t seq_q, seq_kv, head_dim;
  float scale;                    /* 0 means 1/sqrt(head_dim) */
  int causal;
} headsum_attn_shape;

typedef struct {
  int64_t batch, seq, heads, head_dim, model_dim;
} headsum_proj_shape;

/* Library version, "MAJOR.MINOR.PATCH". */
const char* headsum_version(void);
/* This thread's last failure, human-readable; "" if none. */
const char* headsum_last_error(void);
/* Name of the target in force: a native bf16 path ("AMX_BF16",
 * "AVX512_BF16", "NEON_BF16": bf16 calls run on it, every other call on the
 * best Highway target) or a Highway target ("AVX3", "AVX2",
 * "SSE4", "SSSE3", "NEON", "SVE", "SVE2", "SVE_256", "SVE2_128", "SCALAR",
 * "EMU128"). */
const char* headsum_active_target(void);
/* Writes up to `capacity` names of the targets this build compiled (best
 * first: the native bf16 paths, then Highway's) into `names` (may be NULL
 * when capacity is 0); returns their count.  Setting a native path makes
 * bf16 calls use it; setting a Highway target turns the native paths off. */
int headsum_compiled_targets(const char** names, int capacity);
/* Restricts dispatch to `name`; NULL restores the best target the CPU runs.
 * An unknown name, one this build did not compile or one this CPU cannot
 * run gives HEADSUM_ERR_UNSUPPORTED and leaves the target unchanged. The
 * setting is process-wide; calls already running finish on the target they
 * started with. */
headsum_status headsum_set_target(const char* name);
/* Threads used by each call; 0 restores the default (OpenMP's). Process-wide.
 * Without OpenMP every call runs on the calling thread. */
headsum_status headsum_set_num_threads(int n);

/* Floating-point math mode, like oneDNN's fpmath_mode.  STRICT (default):
 * a call takes a native bf16 path only when all its inputs (q, k, v; heads
 * and wo) are bf16; f32 and f16 inputs are computed in f32.  BF16: any
 * input may be rounded to bf16 (to nearest even, once) and multiplied by
 * the native path in force, f32 accumulation (P rounded to bf16 for P V).
 * Process-wide; calls already running keep the mode they started with.
 * Another value: HEADSUM_ERR_INVALID_ARGUMENT, mode unchanged. */
typedef enum { HEADSUM_FPMATH_STRICT = 0, HEADSUM_FPMATH_BF16 = 1 } headsum_fpmath;
headsum_status headsum_set_fpmath(int mode);
int headsum_get_fpmath(void);

/* S = scale * Q K^T, masked entries -inf.  scores [B][H][Sq][Skv]. */
headsum_status headsum_qk_scores(const headsum_attn_shape* shape, const float* q,
                                 const float* k, float* scores);
/* O = softmax(S) V along Skv; entries masked by shape->causal are excluded
 * whatever S holds; a row with every entry masked (-inf) gives zeros. */
headsum_status headsum_softmax_v(const headsum_attn_shape* shape, const float* scores,
                                 const float* v, float* out);
/* O = softmax(scale Q K^T + mask) V, flash-style: S is never materialized. */
headsum_status headsum_attention(const headsum_attn_shape* shape, const float* q,
                                 const float* k, const float* v, float* out);
/* Y[b][s][:] = sum_h O[b][h][s][:] Wo[h] + bias, reading O head-major with no
 * concatenated copy.  bias [D] or NULL. */
headsum_status headsum_project_heads_sum(const headsum_proj_shape* shape,
                                         const float* heads, const float* wo,
                                         const float* bias, float* y);
/* Wo packed once for many calls (weights are fixed across a model's calls):
 * the columns are laid out in the order the projection's register tile
 * reads them.  Only heads, head_dim and model_dim of `shape` matter here;
 * batch and seq must still be >= 1.  The layout does not depend on the
 * target, so a handle stays valid across headsum_set_target.  Free with
 * headsum_wo_free (NULL ok). */
typedef struct headsum_wo_packed headsum_wo_packed;
headsum_status headsum_wo_pack(const headsum_proj_shape* shape, const float* wo,
                               headsum_wo_packed** packed);
/* headsum_project_heads_sum with pre-packed Wo; the result is bitwise that
 * of headsum_project_heads_sum.  shape->heads, head_dim and model_dim must
 * be the packed Wo's. */
headsum_status headsum_project_heads_sum_packed(const headsum_proj_shape* shape,
                                                const float* heads,
                                                const headsum_wo_packed* wo,
                                                const float* bias, float* y);
void headsum_wo_free(headsum_wo_packed* packed);

/* The reference: concatenate O to [B][S][H*L], then one oneDNN matmul with
 * Wo (+ bias).  HEADSUM_ERR_UNSUPPORTED when built without oneDNN. */
headsum_status headsum_concat_project_onednn(const headsum_proj_shape* shape,
                                             const float* heads, const float* wo,
                                             const float* bias, float* y);

/* oneDNN-composed twins of the attention kernels, for tests and benchmarks:
 * batched matmul (with the scale), softmax primitive, batched matmul; causal
 * through a full-size additive mask.  Same shapes and semantics as the
 * headsum kernels; HEADSUM_ERR_UNSUPPORTED when built without oneDNN. */
headsum_status headsum_qk_scores_onednn(const headsum_attn_shape* shape, const float* q,
                                        const float* k, float* scores);
headsum_status headsum_softmax_v_onednn(const headsum_attn_shape* shape,
                                        const float* scores, const float* v, float* out);
headsum_status headsum_attention_onednn(const headsum_attn_shape* shape, const float* q,
                                        const float* k, const float* v, float* out);

/* Per-head contributions (the additive view's payoff).
 * y = sum_h g_h * O_h Wo[h] + bias; per_head[b][s][h][:] = O_h Wo[h]
 * (ungated, no bias). head_gates [H] or NULL (all 1); y [B][S][D] or NULL;
 * per_head [B][S][H][D] or NULL; at least one of y, per_head. A head whose
 * gate is 0 costs nothing when per_head is NULL. */
headsum_status headsum_project_heads_sum_ex(const headsum_proj_shape* shape,
                                            const float* heads, const float* wo,
                                            const float* bias, const float* head_gates,
                                            float* y, float* per_head);
/* out[b][s][h][r] = (O_h Wo[h]) . directions[r][:], computed as
 * O_h . (Wo[h] directions[r]) without materializing contributions.
 * directions [R][D], R >= 1; out [B][S][H][R]. */
headsum_status headsum_head_attribution(const headsum_proj_shape* shape,
                                        const float* heads, const float* wo,
                                        const float* directions, int64_t n_directions,
                                        float* out);
/* The reusable form of attribution for weights and directions that stay
 * fixed across calls: basis[h][r][l] = Wo[h][l] . directions[r], computed
 * once (O(H L D R)); each attribution through it then costs O(B S H L R).
 * Only heads, head_dim and model_dim of `shape` matter here; batch and seq
 * must still be >= 1.  Free with headsum_attribution_basis_free (NULL ok). */
typedef struct headsum_attribution_basis headsum_attribution_basis;
headsum_status headsum_attribution_basis_create(const headsum_proj_shape* shape,
                                                const float* wo, const float* directions,
                                                int64_t n_directions,
                                                headsum_attribution_basis** basis);
/* out[b][s][h][r] as headsum_head_attribution, for the basis' Wo and
 * directions; shape->heads and head_dim must be the basis'. */
headsum_status headsum_head_attribution_basis(const headsum_proj_shape* shape,
                                              const float* heads,
                                              const headsum_attribution_basis* basis,
                                              float* out);
void headsum_attribution_basis_free(headsum_attribution_basis* basis);

/* out[b][s][h] = || O_h Wo[h] ||_2, without writing [B][S][H][D] to memory. */
headsum_status headsum_head_contribution_norms(const headsum_proj_shape* shape,
                                               const float* heads, const float* wo,
                                               float* out);

/* ---------------------------------------------------------------------------
 * Tensors: dtypes and strides (for engines).
 *
 * Engines keep Q/K/V token-major, fuse Q, K and V in one buffer, keep a KV
 * cache with room for more tokens than it holds, and store K, V and weights
 * in 16-bit floats.  These calls take such memory as it is, with no copy:
 * half inputs are widened exactly to f32 inside the kernels' tiles, the
 * arithmetic is f32, and a 16-bit output is the f32 result rounded once to
 * nearest even.
 *
 * A view is indexed [b][h][s][l]: element (b, h, s, l) is at
 *   (element*)data + b*strides[0] + h*strides[1] + s*strides[2] + l
 * (strides in elements of dtype, l contiguous).  A stride of 0 is valid on
 * inputs (one K shared by the batch) and on an output index of extent 1.
 * A KV cache holding `cap` positions is K with strides {Hkv*cap*L, cap*L, L}
 * and shape.seq_kv filled; the positions past seq_kv are never read.  The
 * fused QKV buffer [B][S][3][H][L] is three views of one pointer.
 *
 * Invalid (HEADSUM_ERR_INVALID_ARGUMENT, the message names the tensor and the
 * rule): a NULL tensor or data; an unknown dtype; a negative stride; data
 * not aligned to its element size; an output view in which two indices
 * reach the same element; an output whose byte range [lowest, highest]
 * meets an input's; address arithmetic that overflows. */
typedef enum { HEADSUM_F32 = 0, HEADSUM_F16 = 1, HEADSUM_BF16 = 2 } headsum_dtype;

typedef struct {
  void* data;
  headsum_dtype dtype;
  int64_t strides[3]; /* b, h, s; in elements of dtype */
} headsum_tensor;

/* Contiguous [B][H][S][L]: strides {H*S*L, S*L, L}. */
static inline headsum_tensor headsum_bhsd(void* data, headsum_dtype dtype, int64_t heads,
                                          int64_t seq, int64_t dim) {
  headsum_tensor t;
  t.data = data;
  t.dtype = dtype;
  t.strides[0] = heads * seq * dim;
  t.strides[1] = seq * dim;
  t.strides[2] = dim;
  return t;
}
/* Token-major [B][S][H][L]: strides {S*H*L, L, H*L}. */
static inline headsum_tensor headsum_bshd(void* data, headsum_dtype dtype, int64_t heads,
                                          int64_t seq, int64_t dim) {
  headsum_tensor t;
  t.data = data;
  t.dtype = dtype;
  t.strides[0] = seq * heads * dim;
  t.strides[1] = dim;
  t.strides[2] = heads * dim;
  return t;
}

/* headsum_attention on views: q [B][H][Sq][L], k and v [B][Hkv][Skv][L],
 * out [B][H][Sq][L]; each tensor any dtype. */
headsum_status headsum_attention_tensors(const headsum_attn_shape* shape,
                                         const headsum_tensor* q, const headsum_tensor* k,
                                         const headsum_tensor* v, const headsum_tensor* out);
/* headsum_project_heads_sum on views.  heads: O [B][H][S][L]; wo: rows of
 * [H*L][D], row r at data + r*strides[2] (strides[0], strides[1] unused);
 * y: [B][S][D], (b, s, c) at b*strides[0] + s*strides[2] + c (strides[1]
 * unused); bias f32 [D] or NULL. */
headsum_status headsum_project_heads_sum_tensors(const headsum_proj_shape* shape,
                                                 const headsum_tensor* heads,
                                                 const headsum_tensor* wo, const float* bias,
                                                 const headsum_tensor* y);
/* Wo packed once in its own dtype (f16/bf16 packs stay 16-bit). */
headsum_status headsum_wo_pack_tensor(const headsum_proj_shape* shape,
                                      const headsum_tensor* wo, headsum_wo_packed** packed);
headsum_status headsum_project_heads_sum_packed_tensors(const headsum_proj_shape* shape,
                                                        const headsum_tensor* heads,
                                                        const headsum_wo_packed* wo,
                                                        const float* bias,
                                                        const headsum_tensor* y);
/* dst = src converted to dst's dtype over dims [nb][nh][ns][nl]: round to
 * nearest even, NaN stays NaN, beyond f16's range gives inf, -0 keeps its
 * sign.  Writing new tokens into a 16-bit KV cache is one call. */
headsum_status headsum_convert(const int64_t dims[4], const headsum_tensor* src,
                               const headsum_tensor* dst);

/* ---------------------------------------------------------------------------
 * Attention for the models engines run: what a model adds to the scores,
 * ragged batches, paged KV caches.
 *
 * Positions: query row i of a call with Sq queries over Skv keys sits at
 * position p = i + (Skv - Sq) (bottom-right, as causal is); key j at
 * position j.  Per score, in this order: s = scale q.k; s = softcap *
 * tanh(s / softcap) if softcap > 0; s += alibi_slopes[h] * (j - p);
 * s += bias[b][h][i][j]; then masked keys (causal: j > p; the window) are
 * removed; the row's softmax denominator adds exp(sinks[h] - m) when sinks
 * is set.  A row that sees no key gives zeros (the sinks then take the
 * whole mass). */
typedef struct {
  int64_t window;             /* 0: none; > 0: causal calls see keys
                                 p - window < j <= p (Mistral, Gemma, gpt-oss
                                 sliding layers); non-causal calls see
                                 |j - p| < window */
  float softcap;              /* 0: none; > 0 (Gemma 2: 50) */
  const float* alibi_slopes;  /* NULL or [H] (BLOOM, MPT) */
  const float* sinks;         /* NULL or [H]: a logit per head that joins the
                                 denominator only (gpt-oss) */
  const headsum_tensor* bias; /* NULL or an additive term indexed
                                 [b][h][i][j]: strides {b, h, i}, j
                                 contiguous, any dtype; a stride of 0
                                 broadcasts, so a key-padding mask is
                                 [B][1][1][Skv] with strides {Skv, 0, 0};
                                 -inf removes a key */
} headsum_attn_options;

/* headsum_attention_tensors with options; options NULL (or zeroed) = the
 * plain call.  Invalid besides the tensor rules: window < 0; softcap < 0 or
 * not finite; a NaN or infinite slope or sink; a bias view whose extents or
 * strides overflow, or that meets out. */
headsum_status headsum_attention_tensors_ex(const headsum_attn_shape* shape,
                                            const headsum_attn_options* options,
                                            const headsum_tensor* q, const headsum_tensor* k,
                                            const headsum_tensor* v, const headsum_tensor* out);

/* A ragged batch: sequence b owns query rows q_offsets[b] .. q_offsets[b+1]-1
 * (q_offsets[0] = 0, non-decreasing; a sequence may own none) and attends
 * over its first kv_lens[b] keys; its queries are its last positions, so
 * row r of sequence b sits at p = kv_lens[b] - n_b + (r - q_offsets[b]),
 * n_b its row count (n_b <= kv_lens[b]).  Decode batches (n_b = 1),
 * prefill, chunked prefill and their mix are the same call. */
typedef struct {
  int64_t batch, heads, kv_heads, head_dim; /* kv_heads 0: = heads */
  float scale;                              /* 0: 1/sqrt(head_dim) */
  int causal;
  const int64_t* q_offsets; /* [batch + 1] */
  const int64_t* kv_lens;   /* [batch] */
} headsum_batch_shape;

/* A paged KV cache (vLLM, FlashInfer): pools of blocks of block_size
 * tokens; token t of sequence b is slot t % block_size of block
 * block_table[b * blocks_per_seq + t / block_size].  Element (block n,
 * slot s, kv head g, l) of K is at (element*)k + n*strides[0] +
 * s*strides[1] + g*strides[2] + l; V likewise with the same strides.
 * Blocks may be shared by several sequences (a common prefix).  A
 * contiguous per-sequence cache is block_size = its capacity and one block
 * per sequence. */
typedef struct {
  void* k;
  void* v;
  headsum_dtype dtype;
  int64_t num_blocks, block_size;
  int64_t strides[3];         /* block, slot, kv head */
  const int32_t* block_table; /* [batch][blocks_per_seq] */
  int64_t blocks_per_seq;
} headsum_paged_kv;

/* out = attention of each sequence's rows over its paged keys.  q and out
 * are token-major rows [T][H][L], T = q_offsets[batch]: element (t, h, l)
 * at data + t*strides[2] + h*strides[1] + l (strides[0] unused).  K/V rows
 * are read in place from their blocks.  Invalid besides the tensor and
 * option rules: q_offsets not starting at 0 or decreasing; n_b > kv_lens[b]
 * or kv_lens[b] < 0; a block_table entry outside [0, num_blocks) among the
 * blocks a sequence uses (entries past them are never read); block_size <
 * 1; blocks_per_seq * block_size < a kv_lens[b]; out meeting q or a pool. */
headsum_status headsum_attention_paged(const headsum_batch_shape* shape,
                                       const headsum_attn_options* options,
                                       const headsum_tensor* q, const headsum_paged_kv* kv,
                                       const headsum_tensor* out);

/* Writes each sequence's n_b new K and V rows (k_new, v_new [T][Hkv][L],
 * indexed as q above, any dtype) into its cache positions
 * kv_lens[b] - n_b .. kv_lens[b] - 1, converted to kv->dtype (nearest
 * even): how an engine appends a step before attending.  The block_table
 * entries checked are those of the blocks written.  Invalid besides the
 * rules above: destination slots that meet each other (two sequences
 * writing one shared block slot) or that overlap k_new or v_new. */
headsum_status headsum_paged_kv_write(const headsum_batch_shape* shape,
                                      const headsum_paged_kv* kv, const headsum_tensor* k_new,
                                      const headsum_tensor* v_new);

/* ---------------------------------------------------------------------------
 * The whole layer, its KV cache, and heads across processes.
 *
 * x -> one fused projection x [Wq Wk Wv] (+ biases) -> rotary positions on Q
 * and K -> K, V appended to the cache -> attention over the cache (causal:
 * bottom-right) -> y = sum_h O_h Wo[h] + bo.  Composed from the calls above;
 * x, y and every activation are f32 whatever the storage dtypes are.  A
 * layer is immutable after creation: one layer may serve many threads, each
 * with its own cache.  A cache is used by one call at a time. */
typedef struct {
  int64_t model_dim, heads, kv_heads, head_dim; /* kv_heads 0: = heads */
  int causal;
  float rope_theta;           /* 0: none; else rotary embedding (rotate-half, as
                                 Llama: pair (i, i + L/2), angle = pos *
                                 theta^(-2i/L)) on Q and K at their positions;
                                 needs an even head_dim */
  headsum_dtype weight_dtype; /* storage of the packed weights */
  headsum_dtype cache_dtype;  /* storage of the KV cache */
} headsum_mha_config;
typedef struct headsum_mha headsum_mha;
typedef struct headsum_kv_cache headsum_kv_cache;

/* wq [Dm][H*L], wk and wv [Dm][Hkv*L], wo [H*L][Dm] (x @ W); biases [H*L],
 * [Hkv*L], [Hkv*L], [Dm], each may be NULL.  Weights are copied (rounded to
 * weight_dtype, to nearest even) and packed; the caller's arrays may be
 * freed after.  Free with headsum_mha_free (NULL ok). */
headsum_status headsum_mha_create(const headsum_mha_config* config, const float* wq,
                                  const float* wk, const float* wv, const float* wo,
                                  const float* bq, const float* bk, const float* bv,
                                  const float* bo, headsum_mha** mha);
/* One shard of the layer: query heads [head_begin, head_end) (whole kv
 * groups), given only its own slices: wq [Dm][n*L], wk and wv [Dm][nkv*L],
 * wo [n*L][Dm], bq [n*L], bk and bv [nkv*L] (n = head_end - head_begin, nkv
 * its kv heads), bo [Dm].  Its forward gives the shard's partial sum, sum over
 * its heads of O_h Wo[h], plus bo only in the shard that starts at head 0, so
 * the shards' outputs add up to the layer's (tensor parallelism). */
headsum_status headsum_mha_create_shard(const headsum_mha_config* config, int64_t head_begin,
                                        int64_t head_end, const float* wq, const float* wk,
                                        const float* wv, const float* wo, const float* bq,
                                        const float* bk, const float* bv, const float* bo,
                                        headsum_mha** mha);
/* headsum_mha_create with what the model adds to the scores (options NULL:
 * plain).  The options are copied (slopes and sinks [H], window, softcap);
 * a bias tensor is not supported by the layer (HEADSUM_ERR_INVALID_ARGUMENT
 * names it).  Every forward's attention then applies them, its queries at
 * their cache positions (len .. len+S-1) over keys 0 .. len+S-1.  Invalid
 * besides headsum_mha_create's rules: the option rules of
 * headsum_attention_tensors_ex (window < 0; softcap < 0 or not finite; a
 * NaN or infinite slope or sink), options->bias not NULL. */
headsum_status headsum_mha_create_ex(const headsum_mha_config* config,
                                     const headsum_attn_options* options, const float* wq,
                                     const float* wk, const float* wv, const float* wo,
                                     const float* bq, const float* bk, const float* bv,
                                     const float* bo, headsum_mha** mha);
/* headsum_mha_create_shard with options: options holds the whole layer's
 * slopes and sinks ([config->heads], as headsum_mha_create_ex takes them),
 * and the shard keeps those of its heads [head_begin, head_end), so the
 * shards' outputs still add up to the layer's. */
headsum_status headsum_mha_create_shard_ex(const headsum_mha_config* config,
                                           const headsum_attn_options* options,
                                           int64_t head_begin, int64_t head_end,
                                           const float* wq, const float* wk, const float* wv,
                                           const float* wo, const float* bq, const float* bk,
                                           const float* bv, const float* bo,
                                           headsum_mha** mha);
void headsum_mha_free(headsum_mha* mha);

/* A KV cache for `batch` sequences of up to `capacity` tokens each, for this
 * layer (or shard) only: K (after RoPE) and V in config->cache_dtype, laid
 * out [B][Hkv][capacity][L].  The batch rows advance together. */
headsum_status headsum_kv_cache_create(const headsum_mha* mha, int64_t batch,
                                       int64_t capacity, headsum_kv_cache** cache);
int64_t headsum_kv_cache_length(const headsum_kv_cache* cache); /* tokens held; 0 for NULL */
void headsum_kv_cache_reset(headsum_kv_cache* cache);           /* holds 0 tokens again */
/* Keeps the first `length` tokens (0 <= length <= the tokens held) and drops
 * the rest: a rejected speculative draft, a rewound prompt. */
headsum_status headsum_kv_cache_truncate(headsum_kv_cache* cache, int64_t length);
void headsum_kv_cache_free(headsum_kv_cache* cache);

/* y [B][S][Dm] from x [B][S][Dm] (y may be x).  With a cache: the S tokens
 * take positions len .. len+S-1, their K and V are appended, attention covers
 * all len+S (causal: bottom-right), and len grows by S; a cache without room
 * for S more is HEADSUM_ERR_INVALID_ARGUMENT and is left as it was, as is y.
 * cache NULL: self-attention over x alone, positions 0 .. S-1. */
headsum_status headsum_mha_forward(const headsum_mha* mha, headsum_kv_cache* cache,
                                   int64_t batch, int64_t seq, const float* x, float* y);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* HEADSUM_HEADSUM_H_ */
