// The oneDNN reference paths (see onednn_ref.h).  This is the twin every
// headsum kernel is measured and tested against, so it favours the plainest
// use of oneDNN that still runs its optimized implementations:
//
//   ConcatProject  concat O [B][H][S][L] -> [B*S][H*L], one matmul with Wo (+ b)
//   QkScores       batched matmul 'BGSL,BJL->BGSJ' over B*Hkv with an output
//                  scale and, when causal, a full-size additive mask post-op
//   SoftmaxV       softmax primitive over the last axis, then batched matmul
//                  'BGSJ,BJL->BGSL'
//   Attention      the two composed through a materialized S; an overload
//                  reads K and V in a cache [B*Hkv][cap][L] with only the
//                  first Skv tokens of each head filled (batch stride cap*L)
//
// GQA needs no copy: the G = H/Hkv query heads of kv head g are consecutive,
// so Q [B][H][Sq][L] read as [B*Hkv][G*Sq][L] is contiguous, and so are S and O.
//
// Things oneDNN 2.6.3 would otherwise get wrong or slow:
//  - A binary post-op whose mask broadcasts over the batch dimension makes
//    matmul fall back to its reference implementation ("ref:any"), so the
//    causal mask is full-size [B*Hkv][G*Sq][Skv] (0 or -inf), built once per
//    shape and cached.  When the mask hides nothing (Sq = 1: a decode step
//    sees the whole cache) there is no post-op at all.
//  - Its softmax turns a row whose entries are all -inf into NaN; the headsum
//    contract says such a row gives zeros, so those rows of P are set to 0
//    after the softmax (hence their O rows are 0 too).
//  - Primitive creation costs far more than a small execution, so primitives
//    are cached by shape and thread count (some implementations fix their
//    thread partition at creation).
//  - A primitive with the library-managed scratchpad is not safe to execute
//    from two threads at once; ours use a user scratchpad held per thread.
//
// Per-thread scratch (the concatenated O, S or P, and oneDNN's scratchpad) is
// kept between calls and only grows, so a benchmark measures arithmetic, not
// page faults of a fresh 100 MiB buffer.
#include "kernels/onednn/onednn_ref.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace headsum {
namespace onednn {
namespace {

using dnnl::memory;
using Dims = memory::dims;
using Tag = memory::format_tag;
constexpr memory::data_type kF32 = memory::data_type::f32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);  // thread-safe static init
  return engine;
}

// Sets OpenMP's thread count for this thread's next parallel regions (which
// is what oneDNN's OMP runtime reads at execute) and restores it on exit.
class ScopedThreads {
 public:
  explicit ScopedThreads(int num_threads) {
#if defined(_OPENMP)
    saved_ = omp_get_max_threads();
    if (num_threads > 0 && num_threads != saved_) {
      omp_set_num_threads(num_threads);
      changed_ = true;
    }
#else
    (void)num_threads;
#endif
  }
  ~ScopedThreads() {
#if defined(_OPENMP)
    if (changed_) omp_set_num_threads(saved_);
#endif
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

  // Threads the call runs on; part of a primitive's cache key.
  static int Current() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
  }

 private:
  int saved_ = 1;
  bool changed_ = false;
};

// A growable, page-aligned buffer; grows only, keeps its contents' storage
// between calls (contents are not preserved across growth).
class ScratchBuffer {
 public:
  void* Get(size_t bytes) {
    if (bytes > capacity_) {
      constexpr size_t kAlign = 4096;
      const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
      ptr_.reset();
      capacity_ = 0;
      void* p = std::aligned_alloc(kAlign, rounded);
      if (p == nullptr) throw std::bad_alloc();
      ptr_.reset(p);
      capacity_ = rounded;
    }
    return ptr_.get();
  }
  float* Floats(size_t count) { return static_cast<float*>(Get(count * sizeof(float))); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  size_t capacity_ = 0;
};

// Per-thread scratch: `data` for O concatenated / S / P, `pad` for oneDNN.
struct ThreadScratch {
  ScratchBuffer data;
  ScratchBuffer pad;
};
ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

// ---------------------------------------------------------------------------
// Caches.  Entries are shared_ptr so a call keeps its entry alive even if
// another thread clears the map meanwhile; the maps are cleared wholesale
// when they hold kMaxEntries.

template <typename Value, size_t kMaxEntries>
class ShapeCache {
 public:
  using Key = std::array<int64_t, 9>;
  template <typename Make>
  std::shared_ptr<const Value> GetOrCreate(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    // Create outside the lock: primitive creation takes milliseconds and may
    // itself run OpenMP regions.  Two threads may race to create the same
    // entry; the first one stored wins and the other is dropped.
    std::shared_ptr<const Value> made = make();
    std::lock_guard<std::mutex> lock(mutex_);
    if (map_.size() >= kMaxEntries) map_.clear();
    return map_.emplace(key, std::move(made)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Value>> map_;
};

struct Prim {
  dnnl::primitive prim;
  size_t scratchpad_bytes = 0;
  std::string impl;
};

template <typename Primitive, typename PrimitiveDesc>
std::shared_ptr<const Prim> MakePrim(const PrimitiveDesc& pd) {
  auto p = std::make_shared<Prim>();
  p->prim = Primitive(pd);
  p->scratchpad_bytes = pd.scratchpad_desc().get_size();
  p->impl = pd.impl_info_str();
  return p;
}

// Primitives are small (the JIT code and a few descriptors), so this cache
// is large: a generation loop over a growing KV cache needs three per
// sequence length (QK^T, softmax, PV; ~770 for prefill 512 + 256 steps at
// one thread count, twice that for the layer benchmark's 1- and 2-thread
// rows), and with 2048 entries its steady state finds every one already
// made.  That is generous to oneDNN: an engine would not keep a primitive
// per length (it would recreate them, or use runtime dimensions and
// whatever implementation serves those); here creation is paid once, up
// front, and the loop measures execution only.
using PrimShapeCache = ShapeCache<Prim, 2048>;
PrimShapeCache& PrimCache() {
  static PrimShapeCache cache;
  return cache;
}

// The full-size causal mask [B*Hkv][G*Sq][Skv]: 0 where query i (= row % Sq)
// sees key j, -inf elsewhere.  Not keyed by thread count (nor by the KV
// capacity: it covers S only).  Masks are big (B*H*Sq*Skv floats) and only
// shapes with Sq > 1 need one, so this cache stays small.
struct Mask {
  std::vector<float> values;
};
using MaskShapeCache = ShapeCache<Mask, 64>;
MaskShapeCache& MaskCache() {
  static MaskShapeCache cache;
  return cache;
}

enum Op : int64_t { kProject = 1, kQk, kSoftmax, kPv };

// True when the causal mask hides at least one entry of S.
bool MaskHidesSomething(const AttnDims& a) { return a.causal && a.visible_keys(0) < a.seq_kv; }

// Rows of the batched view: B*Hkv matrices of G*Sq rows.
int64_t Batches(const AttnDims& a) { return static_cast<int64_t>(a.batch * a.kv_heads); }
int64_t GroupRows(const AttnDims& a) { return static_cast<int64_t>(a.group() * a.seq_q); }

std::shared_ptr<const Mask> CausalMask(const AttnDims& a) {
  const MaskShapeCache::Key key{Batches(a),
                                GroupRows(a),
                                static_cast<int64_t>(a.seq_q),
                                static_cast<int64_t>(a.seq_kv),
                                0,
                                0,
                                0,
                                0,
                                0};
  return MaskCache().GetOrCreate(key, [&] {
    auto mask = std::make_shared<Mask>();
    const size_t rows = a.batch * a.heads * a.seq_q;  // = Batches * GroupRows
    const size_t cols = a.seq_kv;
    mask->values.resize(rows * cols);
    float* values = mask->values.data();
    const long long n_rows = static_cast<long long>(rows);
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < n_rows; ++r) {
      const size_t visible = a.visible_keys(static_cast<size_t>(r) % a.seq_q);
      float* row = values + static_cast<size_t>(r) * cols;
      std::fill(row, row + visible, 0.0f);
      std::fill(row + visible, row + cols, kNegInf);
    }
    return std::shared_ptr<const Mask>(std::move(mask));
  });
}

dnnl::primitive_attr UserScratchpadAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// y [M][D] = x [M][K] @ wo [K][D] (+ bias [1][D]).
std::shared_ptr<const Prim> ProjectPrim(const ProjDims& p, bool has_bias) {
  const int64_t m = static_cast<int64_t>(p.batch * p.seq);
  const int64_t k = static_cast<int64_t>(p.inner());
  const int64_t d = static_cast<int64_t>(p.model_dim);
  const PrimShapeCache::Key key{kProject, m, k, d, has_bias, ScopedThreads::Current(), 0, 0, 0};
  return PrimCache().GetOrCreate(key, [&] {
    const memory::desc src({m, k}, kF32, Tag::ab);
    const memory::desc wei({k, d}, kF32, Tag::ab);
    const memory::desc dst({m, d}, kF32, Tag::ab);
    const dnnl::primitive_attr attr = UserScratchpadAttr();
    if (has_bias) {
      const memory::desc bias({1, d}, kF32, Tag::ab);
      return MakePrim<dnnl::matmul>(
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias, dst), attr, CpuEngine()));
    }
    return MakePrim<dnnl::matmul>(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, CpuEngine()));
  });
}

memory::desc ScoresDesc(const AttnDims& a) {
  return memory::desc({Batches(a), GroupRows(a), static_cast<int64_t>(a.seq_kv)}, kF32, Tag::abc);
}

// K or V of a cache [B*Hkv][cap][L], its first Skv tokens per head: read
// as K^T [B*Hkv][L][Skv] (transposed) or V [B*Hkv][Skv][L], by strides, no
// copy.  cap = Skv is the contiguous [B*Hkv][Skv][L].
memory::desc KvDesc(const AttnDims& a, int64_t cap, bool transposed) {
  const int64_t batches = Batches(a);
  const int64_t skv = static_cast<int64_t>(a.seq_kv), l = static_cast<int64_t>(a.head_dim);
  if (transposed) return memory::desc({batches, l, skv}, kF32, Dims{cap * l, 1, l});
  return memory::desc({batches, skv, l}, kF32, Dims{cap * l, l, 1});
}

// S [B*Hkv][G*Sq][Skv] = scale * Q [B*Hkv][G*Sq][L] @ K^T (+ mask).
std::shared_ptr<const Prim> QkPrim(const AttnDims& a, int64_t cap) {
  const int64_t batches = Batches(a), rows = GroupRows(a);
  const int64_t skv = static_cast<int64_t>(a.seq_kv), l = static_cast<int64_t>(a.head_dim);
  const bool masked = MaskHidesSomething(a);
  int64_t scale_bits = 0;
  static_assert(sizeof(float) == 4, "f32");
  std::memcpy(&scale_bits, &a.scale, sizeof(float));
  const PrimShapeCache::Key key{kQk,    batches, rows, skv, l, scale_bits,
                                masked, ScopedThreads::Current(), cap};
  return PrimCache().GetOrCreate(key, [&] {
    const memory::desc q({batches, rows, l}, kF32, Tag::abc);
    const memory::desc kt = KvDesc(a, cap, /*transposed=*/true);
    const memory::desc s = ScoresDesc(a);
    dnnl::primitive_attr attr = UserScratchpadAttr();
    attr.set_output_scales(0, {a.scale});  // applied before post-ops
    if (masked) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, s);  // full-size: see top
      attr.set_post_ops(ops);
    }
    return MakePrim<dnnl::matmul>(
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(q, kt, s), attr, CpuEngine()));
  });
}

// P = softmax(S) along the last axis of [B*H*Sq][Skv]; in place allowed.
std::shared_ptr<const Prim> SoftmaxPrim(const AttnDims& a) {
  const int64_t rows = static_cast<int64_t>(a.batch * a.heads * a.seq_q);
  const int64_t skv = static_cast<int64_t>(a.seq_kv);
  const PrimShapeCache::Key key{kSoftmax, rows, skv, ScopedThreads::Current(), 0, 0, 0, 0, 0};
  return PrimCache().GetOrCreate(key, [&] {
    const memory::desc md({rows, skv}, kF32, Tag::ab);
    return MakePrim<dnnl::softmax_forward>(dnnl::softmax_forward::primitive_desc(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1),
        UserScratchpadAttr(), CpuEngine()));
  });
}

// O [B*Hkv][G*Sq][L] = P [B*Hkv][G*Sq][Skv] @ V [B*Hkv][Skv][L] (of a cache
// [B*Hkv][cap][L]).
std::shared_ptr<const Prim> PvPrim(const AttnDims& a, int64_t cap) {
  const int64_t batches = Batches(a), rows = GroupRows(a);
  const int64_t skv = static_cast<int64_t>(a.seq_kv), l = static_cast<int64_t>(a.head_dim);
  const PrimShapeCache::Key key{kPv, batches, rows, skv, l, ScopedThreads::Current(), cap, 0, 0};
  return PrimCache().GetOrCreate(key, [&] {
    const memory::desc p = ScoresDesc(a);
    const memory::desc v = KvDesc(a, cap, /*transposed=*/false);
    const memory::desc o({batches, rows, l}, kF32, Tag::abc);
    return MakePrim<dnnl::matmul>(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p, v, o),
                                                               UserScratchpadAttr(), CpuEngine()));
  });
}

// ---------------------------------------------------------------------------
// Execution helpers.

memory Wrap(const memory::desc& md, const void* data) {
  // oneDNN takes a non-const handle; inputs are only read.
  return memory(md, CpuEngine(), const_cast<void*>(data));
}

// Runs `prim` with `args` plus this thread's scratchpad, and waits.
void Execute(const Prim& prim, std::unordered_map<int, memory> args) {
  dnnl::stream stream(CpuEngine());
  void* pad = Scratch().pad.Get(prim.scratchpad_bytes);
  args.emplace(DNNL_ARG_SCRATCHPAD, Wrap(memory::desc({static_cast<int64_t>(prim.scratchpad_bytes)},
                                                      memory::data_type::u8, Tag::a),
                                         pad));
  prim.prim.execute(stream, args);
  stream.wait();
}

// The primitives (and mask) of the attention steps at one shape, created
// before anything runs so that a failure (out of memory, no implementation)
// leaves the caller's output untouched.
struct AttnPrims {
  std::shared_ptr<const Prim> qk, softmax, pv;
  std::shared_ptr<const Mask> mask;  // null when the mask hides nothing
};

AttnPrims GetAttnPrims(const AttnDims& a, int64_t cap, bool qk, bool softmax_v) {
  AttnPrims prims;
  if (qk) {
    prims.qk = QkPrim(a, cap);
    if (MaskHidesSomething(a)) prims.mask = CausalMask(a);
  }
  if (softmax_v) {
    prims.softmax = SoftmaxPrim(a);
    prims.pv = PvPrim(a, cap);
  }
  return prims;
}

// s = scale * Q K^T (+ mask), K in a cache of `cap` tokens per head.
void RunQk(const AttnPrims& prims, const AttnDims& a, int64_t cap, const float* q, const float* k,
           float* s) {
  const int64_t batches = Batches(a), rows = GroupRows(a);
  const int64_t l = static_cast<int64_t>(a.head_dim);
  const memory::desc s_md = ScoresDesc(a);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, Wrap(memory::desc({batches, rows, l}, kF32, Tag::abc), q)},
      {DNNL_ARG_WEIGHTS, Wrap(KvDesc(a, cap, /*transposed=*/true), k)},
      {DNNL_ARG_DST, Wrap(s_md, s)}};
  if (prims.mask) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 Wrap(s_md, prims.mask->values.data()));
  }
  Execute(*prims.qk, std::move(args));
}

// p = softmax(s) row-wise (s == p allowed).  A row of s that is -inf
// throughout becomes NaN in oneDNN's softmax; the contract says zeros, so
// such rows of p are set to 0 afterwards (and their rows of O come out 0).
void RunSoftmax(const AttnPrims& prims, const AttnDims& a, const float* s, float* p) {
  const int64_t rows = static_cast<int64_t>(a.batch * a.heads * a.seq_q);
  const int64_t cols = static_cast<int64_t>(a.seq_kv);
  const memory::desc md({rows, cols}, kF32, Tag::ab);

  // Find the all -inf rows before the softmax (it may run in place).  Only
  // rows whose first entry is -inf can qualify, so most rows cost one read.
  std::vector<int64_t> empty_rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = s + r * cols;
    if (row[0] != kNegInf) continue;
    if (std::all_of(row, row + cols, [](float x) { return x == kNegInf; })) {
      empty_rows.push_back(r);
    }
  }
  Execute(*prims.softmax, {{DNNL_ARG_SRC, Wrap(md, s)}, {DNNL_ARG_DST, Wrap(md, p)}});
  for (const int64_t r : empty_rows) std::fill(p + r * cols, p + (r + 1) * cols, 0.0f);
}

// out = p V, V in a cache of `cap` tokens per head.
void RunPv(const AttnPrims& prims, const AttnDims& a, int64_t cap, const float* p, const float* v,
           float* out) {
  const int64_t batches = Batches(a), rows = GroupRows(a);
  const int64_t l = static_cast<int64_t>(a.head_dim);
  Execute(*prims.pv, {{DNNL_ARG_SRC, Wrap(ScoresDesc(a), p)},
                      {DNNL_ARG_WEIGHTS, Wrap(KvDesc(a, cap, /*transposed=*/false), v)},
                      {DNNL_ARG_DST, Wrap(memory::desc({batches, rows, l}, kF32, Tag::abc), out)}});
}

// This thread's last failure, for LastErrorDetail().
std::string& ErrorDetail() {
  thread_local std::string detail;
  return detail;
}
// Records a failure; never throws (it runs inside catch blocks).
void SetErrorDetail(const char* prefix, const char* what) noexcept {
  try {
    ErrorDetail() = std::string(prefix) + what;
  } catch (...) {
    ErrorDetail().clear();
  }
}

// Every entry point converts exceptions to a status: nothing escapes the C API.
template <typename Body>
headsum_status Guarded(int num_threads, Body&& body) {
  try {
    ScopedThreads threads(num_threads);
    body();
    return HEADSUM_OK;
  } catch (const std::bad_alloc&) {
    SetErrorDetail("", "out of memory");
    return HEADSUM_ERR_OUT_OF_MEMORY;
  } catch (const dnnl::error& e) {
    SetErrorDetail("oneDNN: ", e.what());
    return e.status == dnnl_out_of_memory ? HEADSUM_ERR_OUT_OF_MEMORY : HEADSUM_ERR_INTERNAL;
  } catch (const std::exception& e) {
    SetErrorDetail("", e.what());
    return HEADSUM_ERR_INTERNAL;
  } catch (...) {
    SetErrorDetail("", "unknown exception");
    return HEADSUM_ERR_INTERNAL;
  }
}

}  // namespace

headsum_status ConcatProject(const ProjDims& p, const float* heads, const float* wo,
                             const float* bias, float* y, int num_threads) {
  return Guarded(num_threads, [&] {
    const std::shared_ptr<const Prim> prim = ProjectPrim(p, bias != nullptr);
    // 'BHSL->BSHL': concat[b][s][h*L + l] = O[b][h][s][l].
    const size_t l = p.head_dim, inner = p.inner();
    float* concat = Scratch().data.Floats(p.batch * p.seq * inner);
    const long long bs_count = static_cast<long long>(p.batch * p.seq);
#pragma omp parallel for schedule(static)
    for (long long bs = 0; bs < bs_count; ++bs) {
      const size_t b = static_cast<size_t>(bs) / p.seq, s = static_cast<size_t>(bs) % p.seq;
      for (size_t h = 0; h < p.heads; ++h) {
        const float* from = heads + ((b * p.heads + h) * p.seq + s) * l;
        std::copy(from, from + l, concat + static_cast<size_t>(bs) * inner + h * l);
      }
    }
    const int64_t m = bs_count, k = static_cast<int64_t>(inner);
    const int64_t d = static_cast<int64_t>(p.model_dim);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, Wrap(memory::desc({m, k}, kF32, Tag::ab), concat)},
        {DNNL_ARG_WEIGHTS, Wrap(memory::desc({k, d}, kF32, Tag::ab), wo)},
        {DNNL_ARG_DST, Wrap(memory::desc({m, d}, kF32, Tag::ab), y)}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, Wrap(memory::desc({1, d}, kF32, Tag::ab), bias));
    }
    Execute(*prim, std::move(args));
  });
}

headsum_status QkScores(const AttnDims& a, const float* q, const float* k, float* scores,
                        int num_threads) {
  return Guarded(num_threads, [&] {
    const int64_t cap = static_cast<int64_t>(a.seq_kv);
    const AttnPrims prims = GetAttnPrims(a, cap, /*qk=*/true, /*softmax_v=*/false);
    RunQk(prims, a, cap, q, k, scores);
  });
}

headsum_status SoftmaxV(const AttnDims& a, const float* scores, const float* v, float* out,
                        int num_threads) {
  return Guarded(num_threads, [&] {
    const int64_t cap = static_cast<int64_t>(a.seq_kv);
    const AttnPrims prims = GetAttnPrims(a, cap, /*qk=*/false, /*softmax_v=*/true);
    const size_t cols = a.seq_kv;
    const size_t rows = a.batch * a.heads * a.seq_q;
    float* p = Scratch().data.Floats(rows * cols);
    const float* src = scores;
    if (MaskHidesSomething(a)) {
      // Entries the shape masks are excluded whatever `scores` holds there.
      const long long n_rows = static_cast<long long>(rows);
#pragma omp parallel for schedule(static)
      for (long long r = 0; r < n_rows; ++r) {
        const size_t visible = a.visible_keys(static_cast<size_t>(r) % a.seq_q);
        const float* from = scores + static_cast<size_t>(r) * cols;
        float* to = p + static_cast<size_t>(r) * cols;
        std::copy(from, from + visible, to);
        std::fill(to + visible, to + cols, kNegInf);
      }
      src = p;  // softmax in place
    }
    RunSoftmax(prims, a, src, p);
    RunPv(prims, a, cap, p, v, out);
  });
}

headsum_status Attention(const AttnDims& a, const float* q, const float* k, const float* v,
                         float* out, int num_threads) {
  return Attention(a, a.seq_kv, q, k, v, out, num_threads);
}

headsum_status Attention(const AttnDims& a, size_t kv_capacity, const float* q, const float* k,
                         const float* v, float* out, int num_threads) {
  if (kv_capacity < a.seq_kv) {
    SetErrorDetail("", "kv_capacity < seq_kv");
    return HEADSUM_ERR_INVALID_ARGUMENT;
  }
  return Guarded(num_threads, [&] {
    const int64_t cap = static_cast<int64_t>(kv_capacity);
    const AttnPrims prims = GetAttnPrims(a, cap, /*qk=*/true, /*softmax_v=*/true);
    float* s = Scratch().data.Floats(a.batch * a.heads * a.seq_q * a.seq_kv);
    RunQk(prims, a, cap, q, k, s);
    RunSoftmax(prims, a, s, s);
    RunPv(prims, a, cap, s, v, out);
  });
}

std::string DescribeImpls(const AttnDims& a, const ProjDims& p, int num_threads) {
  try {
    ScopedThreads threads(num_threads);
    const int64_t cap = static_cast<int64_t>(a.seq_kv);
    return "qk_matmul=" + QkPrim(a, cap)->impl + " softmax=" + SoftmaxPrim(a)->impl +
           " pv_matmul=" + PvPrim(a, cap)->impl + " project_matmul=" + ProjectPrim(p, true)->impl;
  } catch (const std::exception& e) {
    return std::string("error: ") + e.what();
  }
}

const char* LastErrorDetail() { return ErrorDetail().c_str(); }

}  // namespace onednn
}  // namespace headsum
