// layer_bench: the whole layer (headsum_mha_forward) beside a oneDNN-composed
// layer doing the same steps, Dm = 512, H = 8, L = 64, causal, f32, no RoPE
// (the composition has none):
//   X @ [Wq Wk Wv] + b   one oneDNN matmul (headsum_concat_project_onednn
//                        with one head of Dm)
//   reorder to heads     oneDNN reorders [S][3H][L] -> Q [H][S][L], and K, V
//                        into a preallocated cache [H][cap][L] at position len
//   attention            the composed oneDNN attention (matmul, softmax,
//                        matmul; onednn::Attention with the cache's capacity:
//                        K^T and V read in place by strides, len + S tokens)
//   concat, @ Wo + bo    headsum_concat_project_onednn
// Rows (twins differ in the second field):
//   BM_layer_prefill/{headsum,onednn}/S:512/threads:t      a prefill into an empty cache
//   BM_layer_decode/{headsum,onednn}/Skv:4096/threads:t    one token over 4096 cached
//                                                          (cache capacity 4096 + 256)
//   BM_layer_generate/{headsum,onednn}/P:512/T:256/threads:t
//                                                          prefill 512 + 256 steps into a
//                                                          cache of capacity 768
// The generation rows run one untimed loop first (oneDNN: its primitives for
// every length are then made and cached; see onednn_ref.cc).
// Read the _median rows (--benchmark_repetitions=5 by default).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "headsum/headsum.h"

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
#include "dnnl.hpp"
#include "kernels/onednn/onednn_ref.h"  // Attention over a strided cache
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int64_t kDm = 512, kH = 8, kL = 64, kFused = 3 * kH * kL;
// Room the decode rows' caches keep beyond the 4096 + 1 tokens they use.
constexpr int64_t kDecodeHeadroom = 255;

std::vector<float> Random(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = scale * (float(seed >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

struct Weights {
  std::vector<float> wq = Random(kDm * kH * kL, 0.04f, 1), wk = Random(kDm * kH * kL, 0.04f, 2),
                     wv = Random(kDm * kH * kL, 0.04f, 3), wo = Random(kH * kL * kDm, 0.04f, 4),
                     bq = Random(kH * kL, 0.1f, 5), bk = Random(kH * kL, 0.1f, 6),
                     bv = Random(kH * kL, 0.1f, 7), bo = Random(kDm, 0.1f, 8);
  // [Wq Wk Wv] side by side and its bias, for the composed layer.
  std::vector<float> wqkv, bqkv;
  Weights() {
    for (int64_t k = 0; k < kDm; ++k) {
      for (const std::vector<float>* w : {&wq, &wk, &wv}) {
        wqkv.insert(wqkv.end(), w->begin() + k * kH * kL, w->begin() + (k + 1) * kH * kL);
      }
    }
    for (const std::vector<float>* b : {&bq, &bk, &bv}) bqkv.insert(bqkv.end(), b->begin(), b->end());
  }
};

const Weights& TheWeights() {
  static const Weights w;
  return w;
}

void Check(benchmark::State& state, headsum_status st) {
  if (st != HEADSUM_OK) state.SkipWithError(headsum_last_error());
}

void SetThreads(int n) {
  headsum_set_num_threads(n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

// ---- headsum ------------------------------------------------------------------------

struct HeadsumLayer {
  headsum_mha* mha = nullptr;
  headsum_kv_cache* cache = nullptr;
  explicit HeadsumLayer(int64_t capacity) {
    const Weights& w = TheWeights();
    const headsum_mha_config config = {kDm, kH, 0, kL, 1, 0.0f, HEADSUM_F32, HEADSUM_F32};
    if (headsum_mha_create(&config, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(),
                           w.bq.data(), w.bk.data(), w.bv.data(), w.bo.data(), &mha) ||
        headsum_kv_cache_create(mha, 1, capacity, &cache)) {
      std::abort();
    }
  }
  ~HeadsumLayer() {
    headsum_kv_cache_free(cache);
    headsum_mha_free(mha);
  }
};

void BM_prefill_headsum(benchmark::State& state) {
  const int64_t S = state.range(0);
  SetThreads(int(state.range(1)));
  HeadsumLayer layer(S);
  const std::vector<float> x = Random(size_t(S * kDm), 1.0f, 9);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    headsum_kv_cache_reset(layer.cache);
    Check(state, headsum_mha_forward(layer.mha, layer.cache, 1, S, x.data(), y.data()));
  }
  state.counters["tokens/s"] = benchmark::Counter(double(S), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_decode_headsum(benchmark::State& state) {
  const int64_t len = state.range(0);
  SetThreads(int(state.range(1)));
  HeadsumLayer layer(len + 1 + kDecodeHeadroom);
  const std::vector<float> prompt = Random(size_t(len * kDm), 1.0f, 10);
  std::vector<float> y(prompt.size());
  Check(state, headsum_mha_forward(layer.mha, layer.cache, 1, len, prompt.data(), y.data()));
  const std::vector<float> x = Random(size_t(kDm), 1.0f, 11);
  for (auto _ : state) {
    Check(state, headsum_mha_forward(layer.mha, layer.cache, 1, 1, x.data(), y.data()));
    headsum_kv_cache_truncate(layer.cache, len);  // the next step sees `len` again
  }
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

// Prefill 512, then 256 single-token steps, each fed the last output.
void BM_generate_headsum(benchmark::State& state) {
  const int64_t P = state.range(0), T = state.range(1);
  SetThreads(int(state.range(2)));
  HeadsumLayer layer(P + T);
  const std::vector<float> prompt = Random(size_t(P * kDm), 1.0f, 12);
  std::vector<float> y(prompt.size()), x(static_cast<size_t>(kDm));
  auto generate = [&] {
    headsum_kv_cache_reset(layer.cache);
    Check(state, headsum_mha_forward(layer.mha, layer.cache, 1, P, prompt.data(), y.data()));
    std::memcpy(x.data(), y.data() + (P - 1) * kDm, sizeof(float) * size_t(kDm));
    for (int64_t t = 0; t < T; ++t) {
      Check(state, headsum_mha_forward(layer.mha, layer.cache, 1, 1, x.data(), y.data()));
      std::memcpy(x.data(), y.data(), sizeof(float) * size_t(kDm));
    }
  };
  generate();  // untimed, as the oneDNN twin's
  for (auto _ : state) generate();
  state.counters["tokens/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}

#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
// ---- the oneDNN composition ---------------------------------------------------------

dnnl::engine& Engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Reorders rows [S][rows][L] of the fused qkv (row stride 3HL) into [rows][cap][L]
// at position `at`.
struct ToHeads {
  dnnl::reorder prim;
  dnnl::memory src, dst;
  ToHeads(int64_t S, int64_t rows, int64_t cap) {
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc from({rows, S, kL}, dt::f32, {kL, kFused, 1});
    const dnnl::memory::desc to({rows, S, kL}, dt::f32, {cap * kL, kL, 1});
    src = dnnl::memory(from, Engine(), nullptr);
    dst = dnnl::memory(to, Engine(), nullptr);
    prim = dnnl::reorder(src, dst);
  }
  void Run(const float* from, float* to) {
    src.set_data_handle(const_cast<float*>(from));
    dst.set_data_handle(to);
    dnnl::stream s(Engine());
    prim.execute(s, src, dst);
    s.wait();
  }
};

// onednn::Attention reports through LastErrorDetail, the C API calls
// through headsum_last_error.
void CheckOnednn(benchmark::State& state, headsum_status st) {
  if (st == HEADSUM_OK) return;
  const char* detail = headsum::onednn::LastErrorDetail();
  state.SkipWithError(detail[0] != '\0' ? detail : headsum_last_error());
}

// The KV cache: K and V, each [H][cap][L].
struct OnednnCache {
  int64_t cap;
  std::vector<float> kv;
  explicit OnednnCache(int64_t cap_) : cap(cap_), kv(size_t(2 * kH * cap_ * kL)) {}
  float* k() { return kv.data(); }
  float* v() { return kv.data() + kH * cap * kL; }
};

// The layer's steps for S tokens at a time over a cache.
struct OnednnLayer {
  int64_t S;
  int threads;
  OnednnCache* cache;
  std::vector<float> qkv, q, o;  // qkv [S][3H][L], q and o [H][S][L]
  ToHeads q_to_heads, kv_to_heads;
  OnednnLayer(int64_t S_, int threads_, OnednnCache* cache_)
      : S(S_), threads(threads_), cache(cache_), qkv(size_t(S_ * kFused)), q(size_t(kH * S_ * kL)),
        o(size_t(kH * S_ * kL)), q_to_heads(S_, kH, S_), kv_to_heads(S_, kH, cache_->cap) {}

  // y for the S tokens at positions len .. len + S - 1 (the cache holds len).
  headsum_status Forward(const float* x, int64_t len, float* y) {
    if (len + S > cache->cap) return HEADSUM_ERR_INVALID_ARGUMENT;
    const Weights& w = TheWeights();
    const headsum_proj_shape in = {1, S, 1, kDm, kFused};
    if (headsum_status st = headsum_concat_project_onednn(&in, x, w.wqkv.data(), w.bqkv.data(), qkv.data())) return st;
    q_to_heads.Run(qkv.data(), q.data());
    kv_to_heads.Run(qkv.data() + kH * kL, cache->k() + len * kL);
    kv_to_heads.Run(qkv.data() + 2 * kH * kL, cache->v() + len * kL);
    // Attention over the len + S tokens of the cache [H][cap][L], in place.
    headsum::AttnDims a;
    a.batch = 1;
    a.heads = a.kv_heads = size_t(kH);
    a.seq_q = size_t(S);
    a.seq_kv = size_t(len + S);
    a.head_dim = size_t(kL);
    a.scale = 0.125f;  // 1/sqrt(L), as the C API resolves scale 0
    a.causal = true;
    if (headsum_status st = headsum::onednn::Attention(a, size_t(cache->cap), q.data(), cache->k(),
                                                       cache->v(), o.data(), threads)) {
      return st;
    }
    const headsum_proj_shape out = {1, S, kH, kL, kDm};
    return headsum_concat_project_onednn(&out, o.data(), w.wo.data(), w.bo.data(), y);
  }
};

void BM_prefill_onednn(benchmark::State& state) {
  const int64_t S = state.range(0);
  const int threads = int(state.range(1));
  SetThreads(threads);
  OnednnCache cache(S);
  OnednnLayer layer(S, threads, &cache);
  const std::vector<float> x = Random(size_t(S * kDm), 1.0f, 9);
  std::vector<float> y(x.size());
  for (auto _ : state) CheckOnednn(state, layer.Forward(x.data(), 0, y.data()));
  state.counters["tokens/s"] = benchmark::Counter(double(S), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_decode_onednn(benchmark::State& state) {
  const int64_t len = state.range(0);
  const int threads = int(state.range(1));
  SetThreads(threads);
  // A cache with room beyond the len + 1 tokens the step attends over, as
  // headsum's twin has: attention reads it by strides.
  OnednnCache cache(len + 1 + kDecodeHeadroom);
  OnednnLayer layer(1, threads, &cache);
  const std::vector<float> x = Random(size_t(kDm), 1.0f, 11);
  std::vector<float> y(static_cast<size_t>(kDm));
  // Fill the cache once (any values: the cost does not depend on them).
  const std::vector<float> fill = Random(cache.kv.size(), 1.0f, 13);
  std::memcpy(cache.kv.data(), fill.data(), fill.size() * sizeof(float));
  for (auto _ : state) CheckOnednn(state, layer.Forward(x.data(), len, y.data()));
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

// The twin of BM_generate_headsum: prefill P into a cache of capacity P + T,
// then T single-token steps, each fed the last output; K and V land in the
// cache at len, attention covers len + S tokens of it.
void BM_generate_onednn(benchmark::State& state) {
  const int64_t P = state.range(0), T = state.range(1);
  const int threads = int(state.range(2));
  SetThreads(threads);
  OnednnCache cache(P + T);
  OnednnLayer prefill(P, threads, &cache), step(1, threads, &cache);
  const std::vector<float> prompt = Random(size_t(P * kDm), 1.0f, 12);
  std::vector<float> y(prompt.size()), x(static_cast<size_t>(kDm));
  auto generate = [&] {
    CheckOnednn(state, prefill.Forward(prompt.data(), 0, y.data()));
    std::memcpy(x.data(), y.data() + (P - 1) * kDm, sizeof(float) * size_t(kDm));
    for (int64_t t = 0; t < T; ++t) {
      CheckOnednn(state, step.Forward(x.data(), P + t, y.data()));
      std::memcpy(x.data(), y.data(), sizeof(float) * size_t(kDm));
    }
  };
  generate();  // untimed: makes (and caches) the primitives of every length
  for (auto _ : state) generate();
  state.counters["tokens/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
#endif

void Args(benchmark::internal::Benchmark* b, const char* size_name, int64_t size) {
  for (int t : {1, 2}) b->Args({size, t});
  b->ArgNames({size_name, "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void GenerateArgs(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2}) b->Args({512, 256, t});
  b->ArgNames({"P", "T", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

// Names: BM_layer_prefill/headsum/S:512/threads:1/real_time and so on.
BENCHMARK(BM_prefill_headsum)->Name("BM_layer_prefill/headsum")->Apply([](auto* b) { Args(b, "S", 512); });
BENCHMARK(BM_decode_headsum)->Name("BM_layer_decode/headsum")->Apply([](auto* b) { Args(b, "Skv", 4096); });
BENCHMARK(BM_generate_headsum)->Name("BM_layer_generate/headsum")->Apply(GenerateArgs);
#if defined(HEADSUM_BENCH_HAVE_ONEDNN)
BENCHMARK(BM_prefill_onednn)->Name("BM_layer_prefill/onednn")->Apply([](auto* b) { Args(b, "S", 512); });
BENCHMARK(BM_decode_onednn)->Name("BM_layer_decode/onednn")->Apply([](auto* b) { Args(b, "Skv", 4096); });
BENCHMARK(BM_generate_onednn)->Name("BM_layer_generate/onednn")->Apply(GenerateArgs);
#endif

BENCHMARK_MAIN();
