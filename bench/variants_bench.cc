// The attention variants and paged calls against their plain twins, calls
// alternated within each round (round r times A then B, or B then A), buffers
// 16 bytes off a 64-byte boundary, threads unpinned.  Prints, per row, the
// median time of each call, its GFLOP/s (visible flops: 4 L per visible
// score) or GB/s, and the median over rounds of the per-round speed ratio
// against the twin (the goal of issue 55 beside it).
//
//   build/bench/headsum_variants_bench [--rounds=N] [--threads=N] [--filter=substring]
//
// Rows:
//  - a sliding window of 1024 over S=8192 (causal) against the plain causal
//    call at S=2048, visible-flop speed;
//  - softcap, ALiBi, sinks, a key-padding bias, each at S=512 and 2048,
//    against the plain call of the same shape;
//  - a ragged paged decode (16 sequences of 64..8000 tokens, block 16, H=32
//    Hkv=8 L=128, bf16 cache) against the same work over per-sequence
//    contiguous caches (one block a sequence), and its bytes read against a
//    read-bandwidth probe;
//  - a ragged causal prefill (8 sequences of 17..1500 tokens in one call,
//    block 16) against one dense causal call of S=2048, visible-flop speed;
//  - headsum_paged_kv_write of a 16-sequence decode step against a memcpy
//    of the same bytes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "headsum/headsum.h"

namespace {

size_t Bytes(headsum_dtype t) { return t == HEADSUM_F32 ? 4 : 2; }

// n elements of dtype t 16 bytes past a 64-byte boundary, values in [-1, 1]
// (16-bit: bf16 bits of such values; f16 reads them as finite values too).
struct Buffer {
  std::vector<char> bytes;
  char* data;
  Buffer(size_t n, headsum_dtype t, uint32_t seed) : bytes(n * Bytes(t) + 128) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(bytes.data());
    data = bytes.data() + ((64 - p % 64) % 64) + 16;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      const float f = static_cast<float>(x >> 8) / 8388608.0f - 1.0f;
      if (t == HEADSUM_F32) {
        memcpy(data + 4 * i, &f, 4);
      } else {
        uint32_t u;
        memcpy(&u, &f, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        memcpy(data + 2 * i, &h, 2);
      }
    }
  }
  float* f32() { return reinterpret_cast<float*>(data); }
};

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Pair {
  std::string name;
  std::function<void()> a, b;  // the variant, its twin
  double work_a, work_b;       // flops (or bytes) per call
  const char* unit;            // "GFLOP/s" or "GB/s"
  const char* goal;
};

void RunPair(const Pair& p, int rounds) {
  p.a();  // warm up both (and the library's per-thread buffers)
  p.b();
  // Calls per timing: enough for ~20 ms.
  const double once = std::max(1e-7, Seconds(p.a));
  const int reps = std::max(1, static_cast<int>(0.02 / once));
  std::vector<double> ta, tb, ratio;
  for (int r = 0; r < rounds; ++r) {
    double x, y;
    const auto time = [&](const std::function<void()>& f) {
      return Seconds([&] { for (int i = 0; i < reps; ++i) f(); }) / reps;
    };
    if (r % 2 == 0) {
      x = time(p.a);
      y = time(p.b);
    } else {
      y = time(p.b);
      x = time(p.a);
    }
    ta.push_back(x);
    tb.push_back(y);
    ratio.push_back((p.work_a / x) / (p.work_b / y));
  }
  const double ma = Median(ta), mb = Median(tb);
  printf("%-64s %10.1f us %8.1f %-7s | twin %10.1f us %8.1f | speed ratio %.3f (%s)\n",
         p.name.c_str(), ma * 1e6, p.work_a / ma * 1e-9, p.unit, mb * 1e6, p.work_b / mb * 1e-9,
         Median(ratio), p.goal);
  fflush(stdout);
}

// Visible scores of a causal (or not) call with an optional window.
double VisibleScores(int64_t sq, int64_t skv, bool causal, int64_t window) {
  double n = 0;
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t p = i + skv - sq;
    int64_t lo = 0, hi = skv;
    if (causal) hi = std::min(hi, p + 1);
    if (window > 0) {
      lo = std::max<int64_t>(0, p - window + 1);
      if (!causal) hi = std::min(hi, p + window);
    }
    n += static_cast<double>(std::max<int64_t>(0, hi - lo));
  }
  return n;
}

// A dense attention call on contiguous [B][H][S][L] views of dtype t.
struct Dense {
  headsum_attn_shape shape;
  Buffer q, k, v, out;
  headsum_tensor tq, tk, tv, to;
  Dense(int64_t h, int64_t sq, int64_t skv, int64_t l, bool causal, headsum_dtype t)
      : shape{1, h, 0, sq, skv, l, 0.0f, causal ? 1 : 0},
        q(size_t(h * sq * l), t, 1),
        k(size_t(h * skv * l), t, 2),
        v(size_t(h * skv * l), t, 3),
        out(size_t(h * sq * l), t, 4) {
    tq = headsum_bhsd(q.data, t, h, sq, l);
    tk = headsum_bhsd(k.data, t, h, skv, l);
    tv = headsum_bhsd(v.data, t, h, skv, l);
    to = headsum_bhsd(out.data, t, h, sq, l);
  }
  void Run(const headsum_attn_options* opt) {
    if (headsum_attention_tensors_ex(&shape, opt, &tq, &tk, &tv, &to) != HEADSUM_OK) {
      fprintf(stderr, "%s\n", headsum_last_error());
      exit(1);
    }
  }
  double Flops(int64_t window = 0) const {
    return 4.0 * shape.head_dim * shape.heads *
           VisibleScores(shape.seq_q, shape.seq_kv, shape.causal != 0, window);
  }
};

// A ragged batch over a paged pool ([blocks][block][Hkv][L]).
struct Paged {
  headsum_batch_shape shape;
  std::vector<int64_t> offsets, lens;
  std::vector<int32_t> table;
  headsum_paged_kv kv;
  Buffer k, v, q, out;
  headsum_tensor tq, to;
  static size_t Blocks(const std::vector<int64_t>& lens, int64_t block) {
    size_t n = 0;
    for (int64_t s : lens) n += size_t((s + block - 1) / block);
    return n;
  }
  static int64_t BlockRows(const std::vector<int64_t>& keys, int64_t block, bool one_each) {
    return one_each ? *std::max_element(keys.begin(), keys.end()) : block;
  }
  static size_t PoolElements(const std::vector<int64_t>& keys, int64_t block, bool one_each,
                             int64_t hkv, int64_t l) {
    const int64_t bs = BlockRows(keys, block, one_each);
    return Blocks(keys, bs) * size_t(bs * hkv * l);
  }
  static size_t Rows(const std::vector<int64_t>& rows) {
    size_t n = 0;
    for (int64_t r : rows) n += size_t(r);
    return n;
  }
  Paged(int64_t h, int64_t hkv, int64_t l, const std::vector<int64_t>& rows,
        const std::vector<int64_t>& keys, int64_t block, bool causal, headsum_dtype kv_t,
        bool one_block_each, bool interleaved = true, bool head_major = false)
      : offsets(rows.size() + 1, 0),
        lens(keys),
        k(PoolElements(keys, block, one_block_each, hkv, l), kv_t, 5),
        v(PoolElements(keys, block, one_block_each, hkv, l), kv_t, 6),
        q(Rows(rows) * size_t(h * l), HEADSUM_F32, 7),
        out(Rows(rows) * size_t(h * l), HEADSUM_F32, 8) {
    const int64_t B = int64_t(rows.size());
    for (int64_t b = 0; b < B; ++b) offsets[b + 1] = offsets[b] + rows[b];
    const int64_t bs = BlockRows(keys, block, one_block_each);
    int64_t per_seq = 0;
    for (int64_t s : keys) per_seq = std::max(per_seq, (s + bs - 1) / bs);
    const int64_t num_blocks = int64_t(Blocks(keys, bs));
    // Blocks handed out interleaved across sequences (as an engine's
    // allocator does when sequences grow together), not one run each.
    // (Or each sequence's blocks in one run, as a prompt's are.)
    table.assign(size_t(B * per_seq), 0);
    int32_t next = 0;
    if (interleaved) {
      for (int64_t n = 0; n < per_seq; ++n) {
        for (int64_t b = 0; b < B; ++b) {
          if (n < (keys[b] + bs - 1) / bs) table[size_t(b * per_seq + n)] = next++;
        }
      }
    } else {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t n = 0; n < (keys[b] + bs - 1) / bs; ++n) table[size_t(b * per_seq + n)] = next++;
      }
    }
    shape = headsum_batch_shape{B, h, hkv, l, 0.0f, causal ? 1 : 0, offsets.data(), lens.data()};
    kv.k = k.data;
    kv.v = v.data;
    kv.dtype = kv_t;
    kv.num_blocks = num_blocks;
    kv.block_size = bs;
    kv.strides[0] = bs * hkv * l;
    kv.strides[1] = head_major ? l : hkv * l;       // [blocks][Hkv][block][L] or
    kv.strides[2] = head_major ? bs * l : l;        // [blocks][block][Hkv][L]
    kv.block_table = table.data();
    kv.blocks_per_seq = per_seq;
    const int64_t T = offsets[B];
    tq = headsum_tensor{q.data, HEADSUM_F32, {0, l, h * l}};
    to = headsum_tensor{out.data, HEADSUM_F32, {0, l, h * l}};
    (void)T;
  }
  void Run() {
    if (headsum_attention_paged(&shape, nullptr, &tq, &kv, &to) != HEADSUM_OK) {
      fprintf(stderr, "%s\n", headsum_last_error());
      exit(1);
    }
  }
  double KvBytes() const {
    double n = 0;
    for (int64_t s : lens) n += double(s);
    return n * double(shape.kv_heads * shape.head_dim * 2 * Bytes(kv.dtype));
  }
  double Flops() const {
    double n = 0;
    for (size_t b = 0; b < lens.size(); ++b) {
      n += VisibleScores(offsets[b + 1] - offsets[b], lens[b], shape.causal != 0, 0);
    }
    return 4.0 * double(shape.head_dim * shape.heads) * n;
  }
};

// Read bandwidth: sums 64-bit words of a buffer far larger than the caches.
double ReadProbe(int threads) {
  static std::vector<uint64_t> buf(size_t(1) << 27, 1);  // 1 GiB
  volatile uint64_t sink = 0;
  std::vector<double> gbs;
  for (int r = 0; r < 5; ++r) {
    const double s = Seconds([&] {
      uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
      for (size_t i = 0; i < buf.size(); ++i) total += buf[i];
      sink = sink + total;
    });
    gbs.push_back(double(buf.size() * 8) / s * 1e-9);
  }
  return Median(gbs);
}

// Copy bandwidth: memcpy between two buffers far larger than the caches
// (bytes read plus bytes written, per second).
double CopyProbe() {
  static std::vector<char> src(size_t(1) << 28, 1), dst(size_t(1) << 28, 0);
  std::vector<double> gbs;
  for (int r = 0; r < 5; ++r) {
    const double s = Seconds([&] { memcpy(dst.data(), src.data(), src.size()); });
    gbs.push_back(2.0 * double(src.size()) / s * 1e-9);
  }
  return Median(gbs);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 11, threads = 1;
  std::string filter;
  // --rounds=N, --threads=N, --filter=S, or each with its value as the next
  // argument; anything else is refused (it ran every row silently before).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    const size_t eq = arg.find('=');
    const std::string key = eq == std::string::npos ? arg : arg.substr(0, eq);
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    if (key == "--rounds" && !value.empty()) {
      rounds = atoi(value.c_str());
    } else if (key == "--threads" && !value.empty()) {
      threads = atoi(value.c_str());
    } else if (key == "--filter" && !value.empty()) {
      filter = value;
    } else {
      fprintf(stderr, "usage: %s [--rounds=N] [--threads=N] [--filter=SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1 || threads < 1) {
    fprintf(stderr, "--rounds and --threads take a count of at least 1\n");
    return 2;
  }
  headsum_set_num_threads(threads);
  printf("headsum %s, target %s, %d thread(s), %d rounds\n", headsum_version(),
         headsum_active_target(), threads, rounds);
  const auto want = [&](const std::string& name) {
    return filter.empty() || name.find(filter) != std::string::npos;
  };

  for (headsum_dtype t : {HEADSUM_F32, HEADSUM_BF16}) {
    const std::string name = std::string("window 1024 over S=8192 causal H=8 L=64 ") +
                             (t == HEADSUM_F32 ? "f32" : "bf16") + " vs causal S=2048";
    if (!want(name)) continue;
    auto win = std::make_shared<Dense>(8, 8192, 8192, 64, true, t);
    auto plain = std::make_shared<Dense>(8, 2048, 2048, 64, true, t);
    auto opt = std::make_shared<headsum_attn_options>();
    *opt = {};
    opt->window = 1024;
    RunPair({name, [=] { win->Run(opt.get()); }, [=] { plain->Run(nullptr); },
             win->Flops(1024), plain->Flops(), "GFLOP/s", "goal >= 0.9"},
            rounds);
  }

  // Each variant against the plain call of its shape (not causal, f32).
  const std::vector<float> slopes = [] {
    std::vector<float> s(8);
    for (int h = 0; h < 8; ++h) s[size_t(h)] = std::exp2(-8.0f * (h + 1) / 8);
    return s;
  }();
  const std::vector<float> sinks(8, 0.5f);
  for (int64_t S : {512, 2048}) {
    for (const char* variant : {"softcap 50", "alibi", "sinks", "key-padding bias"}) {
      const std::string name = std::string(variant) + " S=" + std::to_string(S) + " H=8 L=64 f32";
      if (!want(name)) continue;
      auto d = std::make_shared<Dense>(8, S, S, 64, false, HEADSUM_F32);
      auto mask = std::make_shared<Buffer>(size_t(S), HEADSUM_F32, 9);
      for (int64_t j = 0; j < S; ++j) mask->f32()[j] = j < S - S / 8 ? 0.0f : -INFINITY;
      auto bias = std::make_shared<headsum_tensor>(headsum_tensor{mask->data, HEADSUM_F32, {S, 0, 0}});
      auto opt = std::make_shared<headsum_attn_options>();
      *opt = {};
      const char* goal = "goal >= 0.85";
      if (strcmp(variant, "softcap 50") == 0) opt->softcap = 50.0f, goal = "goal >= 0.75";
      if (strcmp(variant, "alibi") == 0) opt->alibi_slopes = slopes.data();
      if (strcmp(variant, "sinks") == 0) opt->sinks = sinks.data();
      if (strcmp(variant, "key-padding bias") == 0) opt->bias = bias.get();
      RunPair({name, [=] { (void)mask; d->Run(opt.get()); }, [=] { d->Run(nullptr); },
               d->Flops(), d->Flops(), "GFLOP/s", goal},
              rounds);
    }
  }

  {
    const std::string name = "paged decode 16 seqs 64..8000 block 16 H=32 Hkv=8 L=128 bf16";
    if (want(name)) {
      std::vector<int64_t> keys(16), rows(16, 1);
      for (int i = 0; i < 16; ++i) keys[size_t(i)] = 64 + (8000 - 64) * ((i * 7) % 16) / 15;
      auto paged = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16, false);
      auto contig = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16, true);
      RunPair({name + " vs one block a sequence", [=] { paged->Run(); }, [=] { contig->Run(); },
               paged->KvBytes(), contig->KvBytes(), "GB/s", "goal >= 0.95"},
              rounds);
      auto runs = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16, false,
                                          /*interleaved=*/false);
      RunPair({"  the same, each sequence's blocks consecutive", [=] { runs->Run(); },
               [=] { contig->Run(); }, runs->KvBytes(), contig->KvBytes(), "GB/s",
               "blocks read as one run"},
              rounds);
      auto hm = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16, false,
                                        /*interleaved=*/true, /*head_major=*/true);
      auto hm_contig = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16,
                                               true, true, /*head_major=*/true);
      RunPair({"  the same, [blocks][Hkv][block][L] pools", [=] { hm->Run(); },
               [=] { hm_contig->Run(); }, hm->KvBytes(), hm_contig->KvBytes(), "GB/s",
               "goal >= 0.95"},
              rounds);
      RunPair({"  [blocks][Hkv][block][L] paged vs [block][Hkv][L] one block a sequence",
               [=] { hm->Run(); }, [=] { contig->Run(); }, hm->KvBytes(), contig->KvBytes(),
               "GB/s", "goal >= 0.95"},
              rounds);
      const double probe = ReadProbe(threads);
      std::vector<double> t;
      for (int r = 0; r < rounds; ++r) t.push_back(Seconds([&] { paged->Run(); }));
      printf("%-64s %10.1f GB/s of K/V read, read probe %.1f GB/s: %.0f%% (goal >= 75%%)\n",
             "  paged decode against the read probe", paged->KvBytes() / Median(t) * 1e-9, probe,
             100.0 * paged->KvBytes() / Median(t) * 1e-9 / probe);
    }
  }
  {
    const std::string name = "ragged causal prefill 8 seqs 17..1500 block 16 H=8 L=64 f32";
    if (want(name)) {
      const std::vector<int64_t> lens = {17, 1500, 230, 811, 64, 1024, 333, 117};
      auto paged = std::make_shared<Paged>(8, 8, 64, lens, lens, 16, true, HEADSUM_F32, false);
      auto dense = std::make_shared<Dense>(8, 2048, 2048, 64, true, HEADSUM_F32);
      RunPair({name + " vs causal S=2048", [=] { paged->Run(); }, [=] { dense->Run(nullptr); },
               paged->Flops(), dense->Flops(), "GFLOP/s", "goal >= 0.9"},
              rounds);
      // The same sequences as one dense causal call each (contiguous).
      std::vector<std::shared_ptr<Dense>> each;
      double each_flops = 0;
      for (int64_t n : lens) {
        each.push_back(std::make_shared<Dense>(8, n, n, 64, true, HEADSUM_F32));
        each_flops += each.back()->Flops();
      }
      RunPair({"  the same, one call vs a dense call per sequence", [=] { paged->Run(); },
               [=] { for (const auto& d : each) d->Run(nullptr); }, paged->Flops(), each_flops,
               "GFLOP/s", "the ragged shape alone"},
              rounds);
      // What the paging costs apart from the ragged shape: the same batch
      // with one block a sequence.
      auto whole = std::make_shared<Paged>(8, 8, 64, lens, lens, 16, true, HEADSUM_F32, true);
      RunPair({"  the same, block 16 vs one block a sequence", [=] { paged->Run(); },
               [=] { whole->Run(); }, paged->Flops(), whole->Flops(), "GFLOP/s", "paging alone"},
              rounds);
    }
  }
  {
    const std::string name = "paged_kv_write 16-seq decode step Hkv=8 L=128 f32 -> bf16";
    if (want(name)) {
      std::vector<int64_t> keys(16), rows(16, 1);
      for (int i = 0; i < 16; ++i) keys[size_t(i)] = 64 + 500 * i;
      auto paged = std::make_shared<Paged>(32, 8, 128, rows, keys, 16, true, HEADSUM_BF16, false);
      auto kn = std::make_shared<Buffer>(size_t(16 * 8 * 128), HEADSUM_F32, 10);
      auto vn = std::make_shared<Buffer>(size_t(16 * 8 * 128), HEADSUM_F32, 11);
      auto tkn = std::make_shared<headsum_tensor>(headsum_tensor{kn->data, HEADSUM_F32, {0, 128, 8 * 128}});
      auto tvn = std::make_shared<headsum_tensor>(headsum_tensor{vn->data, HEADSUM_F32, {0, 128, 8 * 128}});
      const double bytes = 2.0 * 16 * 8 * 128 * (4 + 2);  // read f32, write bf16, K and V
      auto src = std::make_shared<std::vector<char>>(size_t(bytes / 2));
      auto dst = std::make_shared<std::vector<char>>(size_t(bytes / 2));
      RunPair({name + " vs memcpy of its bytes",
               [=] {
                 if (headsum_paged_kv_write(&paged->shape, &paged->kv, tkn.get(), tvn.get()) !=
                     HEADSUM_OK) {
                   fprintf(stderr, "%s\n", headsum_last_error());
                   exit(1);
                 }
               },
               [=] { memcpy(dst->data(), src->data(), src->size()); }, bytes, bytes, "GB/s",
               "an in-cache copy"},
              rounds);
      // Against the copy probe (a memcpy from memory to memory).  The write,
      // repeated, finds its slots in cache: this is its in-cache rate; the
      // row above compares it with an in-cache memcpy of its bytes.
      std::vector<double> t;
      for (int r = 0; r < 5 * rounds; ++r) {
        t.push_back(Seconds([&] {
          headsum_paged_kv_write(&paged->shape, &paged->kv, tkn.get(), tvn.get());
        }));
      }
      const double probe = CopyProbe();
      printf("%-64s %10.1f GB/s, copy probe %.1f GB/s: %.0f%% (goal >= 60%%)\n",
             "  paged_kv_write against the copy probe", bytes / Median(t) * 1e-9, probe,
             100.0 * bytes / Median(t) * 1e-9 / probe);
    }
  }
  return 0;
}
