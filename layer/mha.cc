// The whole attention layer (headsum_mha_*) and its KV cache
// (headsum_kv_cache_*), composed from the public tensor calls:
//
//   qkv = x [Wq Wk Wv] + [bq bk bv]      one packed projection (heads = 1,
//                                        head_dim = Dm) into f32
//                                        [B][S][H + 2 Hkv][L], token-major
//   Q, K <- RoPE at positions len + s    in place on that buffer
//   cache[len .. len+S) <- K, V          headsum_convert, in the cache dtype
//   O = attention(Q over K, V)           strided/16-bit views, causal
//                                        bottom-right, with the options of
//                                        headsum_mha_create_ex (window,
//                                        softcap, ALiBi, sinks); O [B][H][S][L]
//   y = sum_h O_h Wo[h] + bo             the packed projection
//
// Memory per call is linear in S: the activations qkv and O (kept in the
// cache between calls), never a score matrix.
#include "layer/mha.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <new>

#include "dispatch/entry.h"
#include "dispatch/rope.h"
#include "dispatch/test_hooks.h"
#include "dispatch/validate.h"
#include "hwy/aligned_allocator.h"
#include "layer/rope_table.h"

using headsum::dispatch::AllocateFloats;
using headsum::dispatch::CheckAtLeastOne;
using headsum::dispatch::CheckElements;
using headsum::dispatch::CheckPointer;
using headsum::dispatch::Entry;
using headsum::dispatch::Fail;
using headsum::layer::RopeTable;

namespace {

struct PackedDeleter {
  void operator()(headsum_wo_packed* p) const { headsum_wo_free(p); }
};
using PackedPtr = std::unique_ptr<headsum_wo_packed, PackedDeleter>;

// Layers are numbered so that a cache can tell its own layer from another
// one, even one allocated later at the same address.
std::atomic<uint64_t> g_next_layer_id{1};

size_t DtypeBytes(headsum_dtype t) { return t == HEADSUM_F32 ? 4 : 2; }

}  // namespace

struct headsum_mha {
  uint64_t id;
  // The shard's own heads (a whole layer: all of them).
  int64_t model_dim, heads, kv_heads, head_dim;
  int64_t head_begin;  // the shard's first query head in the whole layer
  bool causal;
  headsum_dtype weight_dtype, cache_dtype;
  PackedPtr wqkv;                           // [Dm][(H + 2 Hkv) L], weight_dtype
  PackedPtr wo;                             // [H L][Dm], weight_dtype
  hwy::AlignedFreeUniquePtr<float[]> bqkv;  // [(H + 2 Hkv) L] or null
  hwy::AlignedFreeUniquePtr<float[]> bo;    // [Dm] or null (and in shards past head 0)
  std::unique_ptr<RopeTable> rope;          // null: no rotary embedding
  // What the model adds to the scores (headsum_mha_create_ex), copied:
  // slopes and sinks of the shard's own heads ([heads] or null).
  int64_t window = 0;
  float softcap = 0.0f;
  hwy::AlignedFreeUniquePtr<float[]> slopes, sinks;

  int64_t fused_heads() const { return heads + 2 * kv_heads; }  // rows of qkv per token
  bool plain() const { return window == 0 && softcap == 0.0f && !slopes && !sinks; }
  // The options each forward's attention takes.
  headsum_attn_options options() const {
    headsum_attn_options o;
    o.window = window;
    o.softcap = softcap;
    o.alibi_slopes = slopes.get();
    o.sinks = sinks.get();
    o.bias = nullptr;
    return o;
  }
};

struct headsum_kv_cache {
  uint64_t layer_id;
  int64_t batch, capacity, length;
  int64_t kv_heads, head_dim;
  headsum_dtype dtype;
  // K and V, [B][Hkv][capacity][L] of dtype (held in float-sized storage).
  hwy::AlignedFreeUniquePtr<float[]> k, v;
  // The activations of the last call, grown when a call needs more.
  hwy::AlignedFreeUniquePtr<float[]> scratch;
  size_t scratch_floats = 0;

  headsum_tensor View(float* storage) const {
    headsum_tensor t;
    t.data = storage;
    t.dtype = dtype;
    t.strides[0] = kv_heads * capacity * head_dim;
    t.strides[1] = capacity * head_dim;
    t.strides[2] = head_dim;
    return t;
  }
};

namespace {

// A failure of a call the layer composes, reported under the layer's name.
headsum_status Relay(const char* fn, headsum_status status) {
  if (status == HEADSUM_OK) return status;
  char inner[512];
  snprintf(inner, sizeof(inner), "%s", headsum_last_error());
  return Fail(status, fn, "%s", inner);
}

// The dtype fields may hold any int: read them as one.
headsum_status CheckDtype(const char* fn, const char* name, const headsum_dtype* field) {
  int value;
  static_assert(sizeof(value) == sizeof(*field), "headsum_dtype is an int-sized enum");
  memcpy(&value, field, sizeof(value));
  if (value == HEADSUM_F32 || value == HEADSUM_F16 || value == HEADSUM_BF16) return HEADSUM_OK;
  return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
              "config->%s = %d is no headsum_dtype (HEADSUM_F32 = 0, HEADSUM_F16 = 1, "
              "HEADSUM_BF16 = 2)",
              name, value);
}

// The whole layer's config; kv_heads resolved.
struct Config {
  int64_t model_dim, heads, kv_heads, head_dim;
  bool causal;
  float rope_theta;
  headsum_dtype weight_dtype, cache_dtype;
};

headsum_status CheckConfig(const char* fn, const headsum_mha_config* c, Config* out) {
  HEADSUM_CHECK(CheckPointer(fn, "config", c));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "config->model_dim", c->model_dim));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "config->heads", c->heads));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "config->head_dim", c->head_dim));
  if (c->kv_heads < 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "config->kv_heads = %" PRId64 " must be >= 0 (0 means = heads)", c->kv_heads);
  }
  const int64_t kv_heads = c->kv_heads == 0 ? c->heads : c->kv_heads;
  if (c->heads % kv_heads != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "config->kv_heads = %" PRId64 " does not divide config->heads = %" PRId64,
                kv_heads, c->heads);
  }
  if (!std::isfinite(c->rope_theta) || c->rope_theta < 0.0f) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "config->rope_theta = %g must be finite and >= 0 (0 means no RoPE)",
                static_cast<double>(c->rope_theta));
  }
  if (c->rope_theta != 0.0f && c->head_dim % 2 != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "config->head_dim = %" PRId64
                " must be even for RoPE (config->rope_theta = %g): it pairs i with i + L/2",
                c->head_dim, static_cast<double>(c->rope_theta));
  }
  HEADSUM_CHECK(CheckDtype(fn, "weight_dtype", &c->weight_dtype));
  HEADSUM_CHECK(CheckDtype(fn, "cache_dtype", &c->cache_dtype));
  uint64_t n;
  HEADSUM_CHECK(CheckElements(fn, "[Wq Wk Wv] [Dm][(H + 2 Hkv) L]", &n, c->model_dim,
                              c->heads + 2 * kv_heads, c->head_dim));
  HEADSUM_CHECK(CheckElements(fn, "wo [H L][Dm]", &n, c->heads, c->head_dim, c->model_dim));
  *out = Config{c->model_dim, c->heads,        kv_heads,        c->head_dim,
                c->causal != 0, c->rope_theta, c->weight_dtype, c->cache_dtype};
  return HEADSUM_OK;
}

// A shard is whole kv groups of the layer: [head_begin, head_end) non-empty,
// inside [0, heads), both ends on a group boundary.
headsum_status CheckShard(const char* fn, const Config& c, int64_t head_begin,
                          int64_t head_end) {
  const int64_t group = c.heads / c.kv_heads;
  if (head_begin < 0 || head_end > c.heads || head_begin >= head_end) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "heads [head_begin = %" PRId64 ", head_end = %" PRId64
                ") must be a non-empty range inside [0, config->heads = %" PRId64 ")",
                head_begin, head_end, c.heads);
  }
  if (head_begin % group != 0 || head_end % group != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "heads [head_begin = %" PRId64 ", head_end = %" PRId64
                ") split a kv group: each kv head serves %" PRId64
                " query heads, so both ends must be multiples of %" PRId64,
                head_begin, head_end, group, group);
  }
  return HEADSUM_OK;
}

// The layer's options: those of headsum_attention_tensors_ex
// (CheckAttnOptions, slopes and sinks over the whole layer's heads), and no
// bias tensor, whose [B][H][Sq][Skv] would change with every call.
headsum_status CheckLayerOptions(const char* fn, const headsum_attn_options* options,
                                 const Config& c) {
  if (options == nullptr) return HEADSUM_OK;
  if (options->bias != nullptr) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "options->bias = %p: the layer takes no bias tensor (pass NULL; "
                "headsum_attention_tensors_ex takes one)",
                static_cast<const void*>(options->bias));
  }
  headsum::AttnDims unused_dims{};
  headsum::AttnOptions unused_options;
  return headsum::dispatch::CheckAttnOptions(fn, options, 1, c.heads, 1, 1, nullptr, nullptr,
                                             &unused_dims, &unused_options);
}

// values[head_begin .. head_end) copied into *out (values NULL: *out stays
// null).
headsum_status CopyHeads(const char* fn, const char* what, const float* values,
                         int64_t head_begin, int64_t head_end,
                         hwy::AlignedFreeUniquePtr<float[]>* out) {
  if (values == nullptr) return HEADSUM_OK;
  const size_t n = static_cast<size_t>(head_end - head_begin);
  *out = AllocateFloats(n);
  if (!*out) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for %s", what);
  memcpy(out->get(), values + head_begin, n * sizeof(float));
  return HEADSUM_OK;
}

// `src` (f32 [rows][cols], contiguous) as a tensor of `dtype`: itself for
// f32, else rounded to nearest even into `converted`.
headsum_status WeightTensor(const char* fn, const float* src, int64_t rows, int64_t cols,
                            headsum_dtype dtype, hwy::AlignedFreeUniquePtr<float[]>* converted,
                            headsum_tensor* out) {
  headsum_tensor f32 = headsum_bhsd(const_cast<float*>(src), HEADSUM_F32, 1, rows, cols);
  if (dtype == HEADSUM_F32) {
    *out = f32;
    return HEADSUM_OK;
  }
  const size_t elements = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  *converted = AllocateFloats((elements * DtypeBytes(dtype) + 3) / 4);
  if (!*converted) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for weights");
  *out = headsum_bhsd(converted->get(), dtype, 1, rows, cols);
  const int64_t dims[4] = {1, 1, rows, cols};
  return Relay(fn, headsum_convert(dims, &f32, out));
}

// Packs `w` [rows][cols] as the projection's B operand of `shape`, in dtype.
headsum_status Pack(const char* fn, const headsum_proj_shape& shape, const float* w,
                    int64_t rows, int64_t cols, headsum_dtype dtype, PackedPtr* packed) {
  hwy::AlignedFreeUniquePtr<float[]> converted;
  headsum_tensor t;
  HEADSUM_CHECK(WeightTensor(fn, w, rows, cols, dtype, &converted, &t));
  headsum_wo_packed* made = nullptr;
  HEADSUM_CHECK(Relay(fn, headsum_wo_pack_tensor(&shape, &t, &made)));
  packed->reset(made);
  return HEADSUM_OK;
}

headsum_status CreateLayer(const char* fn, const headsum_mha_config* config,
                           const headsum_attn_options* options, int64_t head_begin,
                           int64_t head_end, bool whole, const float* wq, const float* wk,
                           const float* wv, const float* wo, const float* bq, const float* bk,
                           const float* bv, const float* bo, headsum_mha** mha) {
  Config c;
  HEADSUM_CHECK(CheckConfig(fn, config, &c));
  if (whole) {
    head_begin = 0;
    head_end = c.heads;
  }
  HEADSUM_CHECK(CheckShard(fn, c, head_begin, head_end));
  HEADSUM_CHECK(CheckLayerOptions(fn, options, c));
  HEADSUM_CHECK(CheckPointer(fn, "wq", wq));
  HEADSUM_CHECK(CheckPointer(fn, "wk", wk));
  HEADSUM_CHECK(CheckPointer(fn, "wv", wv));
  HEADSUM_CHECK(CheckPointer(fn, "wo", wo));
  HEADSUM_CHECK(CheckPointer(fn, "mha", mha));

  const int64_t Dm = c.model_dim, L = c.head_dim;
  const int64_t heads = head_end - head_begin, kv_heads = heads / (c.heads / c.kv_heads);
  const int64_t fused = (heads + 2 * kv_heads) * L;  // columns of [Wq Wk Wv]
  std::unique_ptr<headsum_mha> m(new (std::nothrow) headsum_mha{});
  if (!m) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for the layer");
  m->model_dim = Dm;
  m->heads = heads;
  m->kv_heads = kv_heads;
  m->head_dim = L;
  m->head_begin = head_begin;
  m->causal = c.causal;
  m->weight_dtype = c.weight_dtype;
  m->cache_dtype = c.cache_dtype;

  // [Wq Wk Wv] side by side, row k = input feature k, then packed once.
  {
    hwy::AlignedFreeUniquePtr<float[]> w = AllocateFloats(static_cast<size_t>(Dm * fused));
    if (!w) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for [Wq Wk Wv]");
    const size_t q_cols = static_cast<size_t>(heads * L), kv_cols = static_cast<size_t>(kv_heads * L);
    for (size_t k = 0; k < static_cast<size_t>(Dm); ++k) {
      float* row = w.get() + k * static_cast<size_t>(fused);
      memcpy(row, wq + k * q_cols, q_cols * sizeof(float));
      memcpy(row + q_cols, wk + k * kv_cols, kv_cols * sizeof(float));
      memcpy(row + q_cols + kv_cols, wv + k * kv_cols, kv_cols * sizeof(float));
    }
    const headsum_proj_shape shape = {1, 1, 1, Dm, fused};
    HEADSUM_CHECK(Pack(fn, shape, w.get(), Dm, fused, c.weight_dtype, &m->wqkv));
  }
  const headsum_proj_shape wo_shape = {1, 1, heads, L, Dm};
  HEADSUM_CHECK(Pack(fn, wo_shape, wo, heads * L, Dm, c.weight_dtype, &m->wo));

  if (bq != nullptr || bk != nullptr || bv != nullptr) {
    m->bqkv = AllocateFloats(static_cast<size_t>(fused));
    if (!m->bqkv) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for biases");
    const size_t q_cols = static_cast<size_t>(heads * L), kv_cols = static_cast<size_t>(kv_heads * L);
    const struct {
      const float* src;
      size_t at, n;
    } parts[3] = {{bq, 0, q_cols}, {bk, q_cols, kv_cols}, {bv, q_cols + kv_cols, kv_cols}};
    for (const auto& part : parts) {
      if (part.src) {
        memcpy(m->bqkv.get() + part.at, part.src, part.n * sizeof(float));
      } else {
        memset(m->bqkv.get() + part.at, 0, part.n * sizeof(float));
      }
    }
  }
  if (bo != nullptr && head_begin == 0) {  // bo once across the shards
    m->bo = AllocateFloats(static_cast<size_t>(Dm));
    if (!m->bo) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for bo");
    memcpy(m->bo.get(), bo, static_cast<size_t>(Dm) * sizeof(float));
  }
  if (c.rope_theta != 0.0f) {
    m->rope.reset(new (std::nothrow) RopeTable(c.rope_theta, static_cast<size_t>(L)));
    if (!m->rope) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for RoPE");
  }
  if (options != nullptr) {  // the shard's heads of the whole layer's [H]
    m->window = options->window;
    m->softcap = options->softcap;
    HEADSUM_CHECK(CopyHeads(fn, "the ALiBi slopes", options->alibi_slopes, head_begin,
                            head_end, &m->slopes));
    HEADSUM_CHECK(CopyHeads(fn, "the sinks", options->sinks, head_begin, head_end, &m->sinks));
  }
  m->id = g_next_layer_id.fetch_add(1, std::memory_order_relaxed);
  *mha = m.release();
  return HEADSUM_OK;
}

}  // namespace

namespace headsum {
namespace layer {

int64_t OutputElements(const headsum_mha* mha, int64_t batch, int64_t seq) {
  return batch * seq * mha->model_dim;
}

headsum_status CheckForward(const char* fn, const headsum_mha* mha,
                            const headsum_kv_cache* cache, int64_t batch, int64_t seq,
                            const float* x, const float* y) {
  HEADSUM_CHECK(CheckPointer(fn, "mha", mha));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "batch", batch));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "seq", seq));
  HEADSUM_CHECK(CheckPointer(fn, "x", x));
  HEADSUM_CHECK(CheckPointer(fn, "y", y));
  uint64_t n;
  HEADSUM_CHECK(CheckElements(fn, "x/y [B][S][Dm]", &n, batch, seq, mha->model_dim));
  // The activations: qkv [B][S][H + 2 Hkv][L] and O [B][H][S][L], together.
  HEADSUM_CHECK(CheckElements(fn, "qkv and O [B][S][2 H + 2 Hkv][L]", &n, batch, seq,
                              2 * mha->heads + 2 * mha->kv_heads, mha->head_dim));
  if (cache == nullptr) return HEADSUM_OK;
  if (cache->layer_id != mha->id) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "cache was made for another layer (layer #%" PRIu64 ", this is #%" PRIu64 ")",
                cache->layer_id, mha->id);
  }
  if (cache->batch != batch) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "batch = %" PRId64 " is not the cache's batch (%" PRId64 ")", batch,
                cache->batch);
  }
  if (seq > cache->capacity - cache->length) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "seq = %" PRId64 " more tokens overflow the cache: it holds %" PRId64
                " of its capacity %" PRId64,
                seq, cache->length, cache->capacity);
  }
  return HEADSUM_OK;
}

headsum_status Forward(const char* fn, const headsum_mha* mha, headsum_kv_cache* cache,
                       int64_t batch, int64_t seq, const float* x, float* y) {
  const int64_t B = batch, S = seq, Dm = mha->model_dim, L = mha->head_dim;
  const int64_t H = mha->heads, Hkv = mha->kv_heads, N = mha->fused_heads();
  const int64_t pos0 = cache ? cache->length : 0, Skv = pos0 + S;

  const float* angles = nullptr;
  if (mha->rope) {
    angles = mha->rope->Rows(static_cast<size_t>(Skv));
    if (angles == nullptr) {
      return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for the RoPE table");
    }
  }

  // Activations: qkv [B][S][N][L] then O [B][H][S][L].
  const size_t qkv_floats = static_cast<size_t>(B * S * N * L);
  const size_t need = qkv_floats + static_cast<size_t>(B * H * S * L);
  hwy::AlignedFreeUniquePtr<float[]> own;
  float* qkv;
  if (cache != nullptr) {
    if (cache->scratch_floats < need) {
      hwy::AlignedFreeUniquePtr<float[]> grown = AllocateFloats(need);
      if (!grown) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for activations");
      cache->scratch = std::move(grown);
      cache->scratch_floats = need;
    }
    qkv = cache->scratch.get();
  } else {
    own = AllocateFloats(need);
    if (!own) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for activations");
    qkv = own.get();
  }
  float* o = qkv + qkv_floats;

  // qkv = x [Wq Wk Wv] + [bq bk bv]: x [B][S][Dm] is O of one head of Dm.
  const headsum_proj_shape qkv_shape = {B, S, 1, Dm, N * L};
  const headsum_tensor x_view = headsum_bhsd(const_cast<float*>(x), HEADSUM_F32, 1, S, Dm);
  const headsum_tensor qkv_view = headsum_bhsd(qkv, HEADSUM_F32, 1, S, N * L);
  HEADSUM_CHECK(Relay(fn, headsum_project_heads_sum_packed_tensors(
                              &qkv_shape, &x_view, mha->wqkv.get(), mha->bqkv.get(), &qkv_view)));

  // Q and K are the first H + Hkv rows of every token: one rotation pass.
  if (angles != nullptr) {
    const headsum::dispatch::RopeDims rope = {
        static_cast<size_t>(B),     static_cast<size_t>(S), static_cast<size_t>(H + Hkv),
        static_cast<size_t>(N * L), static_cast<size_t>(L), static_cast<size_t>(L / 2),
        static_cast<size_t>(pos0)};
    HEADSUM_CHECK(Relay(fn, headsum::dispatch::RotateHalf(rope, qkv, angles)));
  }

  // Token-major views of the fused buffer: [B][S][N][L] read as [b][h][s][l].
  auto fused_view = [&](int64_t first_row) {
    headsum_tensor t;
    t.data = qkv + first_row * L;
    t.dtype = HEADSUM_F32;
    t.strides[0] = S * N * L;
    t.strides[1] = L;
    t.strides[2] = N * L;
    return t;
  };
  const headsum_tensor q_view = fused_view(0);
  headsum_tensor k_view = fused_view(H), v_view = fused_view(H + Hkv);
  if (cache != nullptr) {
    // Append K and V at positions pos0 .. pos0 + S - 1, in the cache dtype.
    const int64_t dims[4] = {B, Hkv, S, L};
    const size_t at = static_cast<size_t>(pos0 * L) * DtypeBytes(cache->dtype);
    headsum_tensor k_dst = cache->View(cache->k.get()), v_dst = cache->View(cache->v.get());
    k_dst.data = static_cast<char*>(k_dst.data) + at;
    v_dst.data = static_cast<char*>(v_dst.data) + at;
    HEADSUM_CHECK(Relay(fn, headsum_convert(dims, &k_view, &k_dst)));
    HEADSUM_CHECK(Relay(fn, headsum_convert(dims, &v_view, &v_dst)));
    k_view = cache->View(cache->k.get());
    v_view = cache->View(cache->v.get());
  }

  // The queries sit at positions pos0 .. Skv - 1: bottom-right, as the
  // options' positions are.
  const headsum_attn_shape attn = {B, H, Hkv, S, Skv, L, 0.0f, mha->causal ? 1 : 0};
  const headsum_attn_options options = mha->options();
  const headsum_tensor o_view = headsum_bhsd(o, HEADSUM_F32, H, S, L);
  HEADSUM_CHECK(Relay(fn, headsum_attention_tensors_ex(&attn, mha->plain() ? nullptr : &options,
                                                       &q_view, &k_view, &v_view, &o_view)));

  const headsum_proj_shape out_shape = {B, S, H, L, Dm};
  const headsum_tensor y_view = headsum_bhsd(y, HEADSUM_F32, 1, S, Dm);
  HEADSUM_CHECK(Relay(fn, headsum_project_heads_sum_packed_tensors(
                              &out_shape, &o_view, mha->wo.get(), mha->bo.get(), &y_view)));
  if (cache != nullptr) cache->length = Skv;
  return HEADSUM_OK;
}

}  // namespace layer
}  // namespace headsum

extern "C" {

headsum_status headsum_mha_create(const headsum_mha_config* config, const float* wq,
                                  const float* wk, const float* wv, const float* wo,
                                  const float* bq, const float* bk, const float* bv,
                                  const float* bo, headsum_mha** mha) {
  return Entry("headsum_mha_create").RunReporting([&](const char* fn) {
    return CreateLayer(fn, config, nullptr, 0, 0, /*whole=*/true, wq, wk, wv, wo, bq, bk, bv,
                       bo, mha);
  });
}

headsum_status headsum_mha_create_ex(const headsum_mha_config* config,
                                     const headsum_attn_options* options, const float* wq,
                                     const float* wk, const float* wv, const float* wo,
                                     const float* bq, const float* bk, const float* bv,
                                     const float* bo, headsum_mha** mha) {
  return Entry("headsum_mha_create_ex").RunReporting([&](const char* fn) {
    return CreateLayer(fn, config, options, 0, 0, /*whole=*/true, wq, wk, wv, wo, bq, bk, bv,
                       bo, mha);
  });
}

headsum_status headsum_mha_create_shard(const headsum_mha_config* config, int64_t head_begin,
                                        int64_t head_end, const float* wq, const float* wk,
                                        const float* wv, const float* wo, const float* bq,
                                        const float* bk, const float* bv, const float* bo,
                                        headsum_mha** mha) {
  return Entry("headsum_mha_create_shard").RunReporting([&](const char* fn) {
    return CreateLayer(fn, config, nullptr, head_begin, head_end, /*whole=*/false, wq, wk, wv,
                       wo, bq, bk, bv, bo, mha);
  });
}

headsum_status headsum_mha_create_shard_ex(const headsum_mha_config* config,
                                           const headsum_attn_options* options,
                                           int64_t head_begin, int64_t head_end,
                                           const float* wq, const float* wk, const float* wv,
                                           const float* wo, const float* bq, const float* bk,
                                           const float* bv, const float* bo,
                                           headsum_mha** mha) {
  return Entry("headsum_mha_create_shard_ex").RunReporting([&](const char* fn) {
    return CreateLayer(fn, config, options, head_begin, head_end, /*whole=*/false, wq, wk, wv,
                       wo, bq, bk, bv, bo, mha);
  });
}

void headsum_mha_free(headsum_mha* mha) { delete mha; }

headsum_status headsum_kv_cache_create(const headsum_mha* mha, int64_t batch,
                                       int64_t capacity, headsum_kv_cache** cache) {
  uint64_t n;  // elements of K, and of V
  return Entry("headsum_kv_cache_create")
      .Pointer("mha", mha)
      .Check(CheckAtLeastOne, "batch", batch)
      .Check(CheckAtLeastOne, "capacity", capacity)
      .Pointer("cache", cache)
      .Check([&](const char* fn) {
        return CheckElements(fn, "cache K/V [B][Hkv][capacity][L]", &n, batch, mha->kv_heads,
                             capacity, mha->head_dim);
      })
      .RunReporting([&](const char* fn) -> headsum_status {
        std::unique_ptr<headsum_kv_cache> c(new (std::nothrow) headsum_kv_cache{});
        if (!c) return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for the cache");
        c->layer_id = mha->id;
        c->batch = batch;
        c->capacity = capacity;
        c->length = 0;
        c->kv_heads = mha->kv_heads;
        c->head_dim = mha->head_dim;
        c->dtype = mha->cache_dtype;
        const size_t floats = (static_cast<size_t>(n) * DtypeBytes(c->dtype) + 3) / 4;
        c->k = AllocateFloats(floats);
        c->v = c->k ? AllocateFloats(floats) : nullptr;
        if (!c->v) {
          return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn,
                      "out of memory for K and V (2 x %" PRIu64 " elements)", n);
        }
        // The angles of every position the cache can hold, once, here: its
        // forward calls then never grow the table.
        if (mha->rope && mha->rope->Rows(static_cast<size_t>(capacity)) == nullptr) {
          return Fail(HEADSUM_ERR_OUT_OF_MEMORY, fn, "out of memory for the RoPE table");
        }
        *cache = c.release();
        return HEADSUM_OK;
      });
}

int64_t headsum_kv_cache_length(const headsum_kv_cache* cache) {
  return cache == nullptr ? 0 : cache->length;
}

void headsum_kv_cache_reset(headsum_kv_cache* cache) {
  if (cache != nullptr) cache->length = 0;
}

headsum_status headsum_kv_cache_truncate(headsum_kv_cache* cache, int64_t length) {
  static const char* fn = "headsum_kv_cache_truncate";
  HEADSUM_CHECK(CheckPointer(fn, "cache", cache));
  if (length < 0 || length > cache->length) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "length = %" PRId64 " must be in [0, %" PRId64 "], the tokens the cache holds",
                length, cache->length);
  }
  cache->length = length;
  return HEADSUM_OK;
}

void headsum_kv_cache_free(headsum_kv_cache* cache) { delete cache; }

headsum_status headsum_mha_forward(const headsum_mha* mha, headsum_kv_cache* cache,
                                   int64_t batch, int64_t seq, const float* x, float* y) {
  return Entry("headsum_mha_forward")
      .Check(headsum::layer::CheckForward, mha, cache, batch, seq, x, y)
      .RunReporting([&](const char* fn) {
        return headsum::layer::Forward(fn, mha, cache, batch, seq, x, y);
      });
}

}  // extern "C"
