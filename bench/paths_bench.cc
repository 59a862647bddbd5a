// Whether each path of the attention table (dispatch/attention_paths.h)
// still wins where the table picks it: per case, the call as dispatch runs
// it against the same call with each other path forced, calls alternated
// (each round times every variant once, in rotated order), buffers 16 bytes
// off a 64-byte boundary, threads unpinned.  Prints, per case and variant,
// the median time per call and the median over rounds of its time over the
// picked path's within the round (> 1: the picked path is faster).
//
//   build/bench/headsum_paths_bench [--rounds=N] [--threads=N] [--filter=substring]
//
// Paths that cannot run a case (the table's `runs`) are left out of it; a
// forced path runs only the blocks it can, the rest as the table picks.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/attention_paths.h"
#include "dispatch/test_hooks.h"
#include "headsum/headsum.h"

namespace {

struct Case {
  const char* name;
  int64_t b, h, hkv, sq, skv, l;
  bool causal;
  headsum_dtype kv;
  bool from_memory;  // K/V counted as read from memory (prefetching forms)
};

// Where each path is picked (decode rows and groups, streams, the
// aligned frame, rows by keys, tiles) and a case beside it.
const Case kCases[] = {
    {"MHA decode f32 Skv=512 (aligned frame)", 1, 8, 8, 1, 512, 64, false, HEADSUM_F32, false},
    {"MHA decode f32 Skv=4096", 1, 8, 8, 1, 4096, 128, false, HEADSUM_F32, false},
    {"MHA decode bf16 Skv=16384 from memory (stream)", 1, 16, 16, 1, 16384, 128, false,
     HEADSUM_BF16, true},
    {"MHA decode f16 Skv=16384 from memory (stream)", 1, 16, 16, 1, 16384, 128, false,
     HEADSUM_F16, true},
    {"GQA decode bf16 H=32 Hkv=8 Skv=4096 (groups)", 1, 32, 8, 1, 4096, 128, false, HEADSUM_BF16,
     false},
    {"GQA decode f32 H=8 Hkv=2 Skv=2048 (groups)", 1, 8, 2, 1, 2048, 64, false, HEADSUM_F32,
     false},
    {"seed S=20 (groups, short block)", 1, 8, 8, 20, 20, 64, false, HEADSUM_F32, false},
    {"5 rows causal over 300 keys (rows by keys)", 1, 8, 8, 5, 300, 64, true, HEADSUM_F32, false},
    {"8 rows causal over 1024 keys (rows by keys)", 1, 8, 8, 8, 1024, 64, true, HEADSUM_F32,
     false},
    {"prefill S=512 causal (tiles)", 1, 8, 8, 512, 512, 64, true, HEADSUM_F32, false},
    {"prefill S=512 bf16 K/V (tiles, head packing)", 1, 8, 8, 512, 512, 64, false, HEADSUM_BF16,
     false},
};

size_t Bytes(headsum_dtype t) { return t == HEADSUM_F32 ? 4 : 2; }

// A buffer of n elements of dtype t starting 16 bytes past a 64-byte
// boundary, values in [-1, 1] rounded to t.
struct Buffer {
  std::vector<char> bytes;
  char* data;
  Buffer(size_t n, headsum_dtype t, uint32_t seed) : bytes(n * Bytes(t) + 128) {
    uintptr_t p = reinterpret_cast<uintptr_t>(bytes.data());
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
        // f16 from a small float: through the library's own conversion would
        // need a call; values in [-1, 1] as bf16 bits serve both (f16 reads
        // them as other finite values of the same order of magnitude).
        const uint16_t h = t == HEADSUM_BF16 ? static_cast<uint16_t>(u >> 16)
                                             : static_cast<uint16_t>(0x3800 | (x >> 22));
        memcpy(data + 2 * i, &h, 2);
      }
    }
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15, threads = 1;
  const char* filter = "";
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--rounds=", 9) == 0) rounds = atoi(argv[i] + 9);
    else if (strncmp(argv[i], "--threads=", 10) == 0) threads = atoi(argv[i] + 10);
    else if (strncmp(argv[i], "--filter=", 9) == 0) filter = argv[i] + 9;
    else {
      fprintf(stderr, "usage: %s [--rounds=N] [--threads=N] [--filter=substring]\n", argv[0]);
      return 2;
    }
  }
  headsum_set_num_threads(threads);
  printf("target %s, %d thread(s), %d rounds, buffers 16 bytes off\n", headsum_active_target(),
         threads, rounds);
  using headsum::dispatch::AttnPaths;
  using headsum::dispatch::kAttnPathCount;
  for (const Case& c : kCases) {
    if (strstr(c.name, filter) == nullptr) continue;
    headsum_attn_shape shape = {c.b, c.h, c.hkv, c.sq, c.skv, c.l, 0.0f, c.causal ? 1 : 0};
    Buffer q(size_t(c.b * c.h * c.sq * c.l), HEADSUM_F32, 1);
    Buffer k(size_t(c.b * c.hkv * c.skv * c.l), c.kv, 2);
    Buffer v(size_t(c.b * c.hkv * c.skv * c.l), c.kv, 3);
    Buffer o(size_t(c.b * c.h * c.sq * c.l), HEADSUM_F32, 4);
    headsum_tensor tq = headsum_bhsd(q.data, HEADSUM_F32, c.h, c.sq, c.l);
    headsum_tensor tk = headsum_bhsd(k.data, c.kv, c.hkv, c.skv, c.l);
    headsum_tensor tv = headsum_bhsd(v.data, c.kv, c.hkv, c.skv, c.l);
    headsum_tensor to = headsum_bhsd(o.data, HEADSUM_F32, c.h, c.sq, c.l);
    headsum::testing::SetKvInCacheBytes(c.from_memory ? 0 : headsum::testing::kKvInCacheAuto);
    // Variants: -1 the table's pick, then each path forced; a forced path
    // that ran no row of the case is left out.
    std::vector<int> variants = {-1};
    std::vector<std::string> names = {"picked"};
    std::string picked;
    headsum::testing::CountAttentionPathRows(true);
    headsum_attention_tensors(&shape, &tq, &tk, &tv, &to);
    for (size_t p = 0; p < kAttnPathCount; ++p) {
      if (headsum::testing::AttentionPathRows(int(p)) != 0) {
        picked += std::string(picked.empty() ? "" : "+") + AttnPaths()[p].name;
      }
    }
    for (size_t p = 0; p < kAttnPathCount; ++p) {
      headsum::testing::ForceAttentionPath(int(p));
      headsum::testing::CountAttentionPathRows(true);
      headsum_attention_tensors(&shape, &tq, &tk, &tv, &to);
      if (headsum::testing::AttentionPathRows(int(p)) == 0) continue;
      if (picked == AttnPaths()[p].name) continue;  // the pick itself
      variants.push_back(int(p));
      names.push_back(AttnPaths()[p].name);
    }
    headsum::testing::ForceAttentionPath(-1);
    headsum::testing::CountAttentionPathRows(false);
    // Calls per timing: about 20 ms of the picked path.
    const auto time_calls = [&](int variant, int n) {
      headsum::testing::ForceAttentionPath(variant);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) headsum_attention_tensors(&shape, &tq, &tk, &tv, &to);
      const auto t1 = std::chrono::steady_clock::now();
      headsum::testing::ForceAttentionPath(-1);
      return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
    };
    const double once = time_calls(-1, 3);
    const int n = std::max(1, static_cast<int>(20000.0 / std::max(once, 1.0)));
    std::vector<std::vector<double>> times(variants.size()), ratios(variants.size());
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> t(variants.size());
      for (size_t i = 0; i < variants.size(); ++i) {
        const size_t j = (i + static_cast<size_t>(r)) % variants.size();
        t[j] = time_calls(variants[j], n);
      }
      for (size_t j = 0; j < variants.size(); ++j) {
        times[j].push_back(t[j]);
        ratios[j].push_back(t[j] / t[0]);
      }
    }
    printf("\n%s  (picked: %s)\n", c.name, picked.c_str());
    for (size_t j = 0; j < variants.size(); ++j) {
      printf("  %-22s %10.1f us  %6.3fx the picked time\n", names[j].c_str(), Median(times[j]),
             Median(ratios[j]));
    }
  }
  headsum::testing::SetKvInCacheBytes(headsum::testing::kKvInCacheAuto);
  return 0;
}
