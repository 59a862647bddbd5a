// headsum_attention_paged and headsum_paged_kv_write: ragged batches (decode
// rows, prefill, chunked prefill and their mix) over a paged KV cache, on
// every compiled target, against the double reference of each sequence
// over its keys gathered from the blocks (tests/reference.h), with the
// bounds of tests/error_bounds.cc.  Block sizes 1, 16, 64 and one block per
// sequence; shuffled block tables; a prefix block shared by several
// sequences; sequences with no query rows; both pool layouts; every
// validation rule with the outputs untouched; the same bits whatever the
// thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../dispatch/attention_paths.h"  // the table of attention paths
#include "../dispatch/test_hooks.h"
#include "error_bounds.h"
#include "headsum/headsum.h"
#include "reference.h"
#include "tensor_util.h"
#include "test_util.h"

namespace headsum_test {
namespace {

// A ragged batch over a paged pool, built and filled.
struct PagedCase {
  const char* name;
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> rows, keys;  // n_b and kv_lens[b]
  bool causal;
  bool head_major_pool;  // [blocks][Hkv][block][L] rather than [blocks][block][Hkv][L]
  bool share_prefix;     // sequences 0 and 1 share their first block
  int64_t window = 0;
  float softcap = 0.0f;
  bool slopes = false, sinks = false;
  // Blocks handed out in order from a pool without gaps between blocks:
  // runs of consecutive blocks read as one.
  bool sequential_blocks = false;
};

const PagedCase kPagedCases[] = {
    {"decode, block 16, GQA", 8, 2, 64, 16, {1, 1, 1, 1}, {1, 17, 300, 1100}, true, false, true},
    {"prefill, block 1", 2, 2, 17, 1, {3, 20, 5}, {3, 20, 9}, true, false, false},
    {"mixed, block 64, MQA", 4, 1, 32, 64, {1, 0, 70, 5}, {700, 40, 130, 5}, true, true, true},
    {"one block a sequence", 2, 1, 16, 200, {4, 1}, {150, 200}, false, false, false},
    {"chunked prefill, window, all", 4, 2, 64, 16, {33, 1, 17}, {90, 530, 17}, true, false,
     true, 24, 3.0f, true, true},
    {"decode, head-major pool, sinks", 4, 4, 64, 16, {1, 1, 1}, {1030, 3, 64}, true, true, false,
     0, 0.0f, false, true},
    {"the seed, one sequence", 8, 8, 64, 16, {20}, {20}, true, false, false},
    {"consecutive blocks, mixed", 8, 2, 32, 16, {1, 40, 1}, {1100, 90, 37}, true, false, false,
     0, 0.0f, false, false, true},
};

struct PagedBuffers {
  int64_t num_blocks = 0, blocks_per_seq = 0;
  std::vector<int32_t> table;
  Strided k_pool, v_pool;
  int64_t strides[3] = {0, 0, 0};  // block, slot, kv head
  std::vector<int64_t> q_offsets;
  // Each sequence's keys and values gathered [Hkv][kv_len][L] (as the
  // kernel reads them: rounded to the pool's dtype).
  std::vector<std::vector<float>> k_seq, v_seq;
};

int64_t BlocksFor(int64_t keys, int64_t block) { return (keys + block - 1) / block; }

PagedBuffers MakePaged(const PagedCase& c, headsum_dtype dtype, uint64_t seed) {
  PagedBuffers p;
  const int64_t B = int64_t(c.rows.size()), G = c.kv_heads, L = c.head_dim, bs = c.block_size;
  for (int64_t b = 0; b < B; ++b) p.blocks_per_seq = std::max(p.blocks_per_seq, BlocksFor(c.keys[b], bs));
  p.blocks_per_seq += 1;  // an unused entry past each sequence's blocks (never read)
  int64_t needed = 0;
  for (int64_t b = 0; b < B; ++b) needed += BlocksFor(c.keys[b], bs);
  p.num_blocks = needed + 3;  // some blocks no sequence uses
  // A shuffled permutation of the blocks, handed out in order.
  std::vector<int32_t> perm(size_t(p.num_blocks));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  uint64_t state = seed;
  for (size_t i = perm.size(); i > 1 && !c.sequential_blocks; --i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(perm[i - 1], perm[size_t(state >> 33) % i]);
  }
  p.table.assign(size_t(B * p.blocks_per_seq), -7);  // -7: past the used blocks
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < BlocksFor(c.keys[b], bs); ++n) {
      if (c.share_prefix && b == 1 && n == 0 && B > 1) {
        p.table[size_t(b * p.blocks_per_seq)] = p.table[0];  // sequence 0's first block
        continue;
      }
      p.table[size_t(b * p.blocks_per_seq + n)] = perm[next++];
    }
  }
  // Pools with padded strides.
  if (c.head_major_pool) {  // [blocks][Hkv][bs][L + 4]
    p.strides[1] = L + 4;
    p.strides[2] = bs * (L + 4);
    p.strides[0] = G * bs * (L + 4) + 8;
  } else {  // [blocks][bs][Hkv][L], 8 elements between blocks
    p.strides[2] = L;
    p.strides[1] = G * L;
    p.strides[0] = bs * G * L + (c.sequential_blocks ? 0 : 8);
  }
  const size_t elems = size_t(p.num_blocks * p.strides[0]);
  const int64_t dims[4] = {p.num_blocks, G, bs, L};
  const int64_t view_strides[3] = {p.strides[0], p.strides[2], p.strides[1]};
  p.k_pool = MakeView(dtype, dims, view_strides, elems, 0xFF);
  p.v_pool = MakeView(dtype, dims, view_strides, elems, 0xFF);
  const std::vector<float> kr = RandomUniform(elems, -1.5f, 1.5f, seed + 1);
  const std::vector<float> vr = RandomUniform(elems, -1.0f, 1.0f, seed + 2);
  size_t n = 0;
  for (int64_t blk = 0; blk < p.num_blocks; ++blk)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t s = 0; s < bs; ++s, ++n)
        for (int64_t l = 0; l < L; ++l) {
          EncodeElement(kr[(n * size_t(L) + size_t(l)) % elems], p.k_pool.at(blk, g, s, l), dtype);
          EncodeElement(vr[(n * size_t(L) + size_t(l)) % elems], p.v_pool.at(blk, g, s, l), dtype);
        }
  p.q_offsets.assign(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) p.q_offsets[size_t(b + 1)] = p.q_offsets[size_t(b)] + c.rows[b];
  p.k_seq.resize(size_t(B));
  p.v_seq.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t S = c.keys[b];
    p.k_seq[b].resize(size_t(G * S * L));
    p.v_seq[b].resize(size_t(G * S * L));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t blk = p.table[size_t(b * p.blocks_per_seq + t / bs)];
        for (int64_t l = 0; l < L; ++l) {
          const size_t at = size_t((g * S + t) * L + l);
          p.k_seq[b][at] = float(DecodeElement(p.k_pool.at(blk, g, t % bs, l), dtype));
          p.v_seq[b][at] = float(DecodeElement(p.v_pool.at(blk, g, t % bs, l), dtype));
        }
      }
  }
  return p;
}

headsum_paged_kv KvOf(PagedBuffers& p, const PagedCase& c, headsum_dtype dtype) {
  headsum_paged_kv kv;
  kv.k = p.k_pool.base();
  kv.v = p.v_pool.base();
  kv.dtype = dtype;
  kv.num_blocks = p.num_blocks;
  kv.block_size = c.block_size;
  for (int i = 0; i < 3; ++i) kv.strides[i] = p.strides[i];
  kv.block_table = p.table.data();
  kv.blocks_per_seq = p.blocks_per_seq;
  return kv;
}

headsum_batch_shape BatchOf(const PagedCase& c, const PagedBuffers& p) {
  headsum_batch_shape s;
  s.batch = int64_t(c.rows.size());
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.scale = 0.0f;
  s.causal = c.causal ? 1 : 0;
  s.q_offsets = p.q_offsets.data();
  s.kv_lens = c.keys.data();
  return s;
}

// Token rows [T][H][L] of dtype t (strides {0, L, H*L}, 16 bytes + off).
Strided TokenRows(headsum_dtype t, int64_t T, int64_t H, int64_t L, unsigned char fill) {
  const int64_t dims[4] = {1, H, std::max<int64_t>(T, 1), L}, st[3] = {0, L, H * L};
  return MakeView(t, dims, st, size_t(std::max<int64_t>(T, 1) * H * L), fill);
}

// The reference and bound of sequence b's rows ([H][n_b][L]).
void SequenceReference(const PagedCase& c, const PagedBuffers& p, size_t b,
                       const std::vector<float>& q_rows /* [n_b][H][L] */,
                       const std::vector<float>& slopes, const std::vector<float>& sinks,
                       headsum_dtype out_dtype, std::vector<double>* ref,
                       std::vector<double>* bound) {
  const int64_t n = c.rows[b], S = c.keys[b], H = c.heads, L = c.head_dim;
  headsum_attn_shape shape = {1, H, c.kv_heads, n, S, L, 0.0f, c.causal ? 1 : 0};
  RefAttnDims d(shape);
  d.window = c.window;
  d.softcap = c.softcap;
  d.slopes = c.slopes ? slopes.data() : nullptr;
  d.sinks = c.sinks ? sinks.data() : nullptr;
  std::vector<float> q(size_t(H * n * L));  // [H][n][L]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) q[size_t((h * n + i) * L + l)] = q_rows[size_t((i * H + h) * L + l)];
  *ref = RefAttention(d, q.data(), p.k_seq[b].data(), p.v_seq[b].data());
  *bound = AttentionBound(d, q.data(), p.k_seq[b].data(), p.v_seq[b].data());
  const double u16 = OutputRoundoff(out_dtype), floor16 = OutputAbsFloor(out_dtype);
  for (size_t i = 0; i < bound->size(); ++i) {
    (*bound)[i] += u16 * (std::fabs((*ref)[i]) + (*bound)[i]) + floor16;
  }
}

// out's rows of sequence b as [H][n_b][L].
std::vector<float> SequenceRows(Strided& out, const PagedCase& c, int64_t t0, int64_t n) {
  std::vector<float> o(size_t(c.heads * n * c.head_dim));
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t l = 0; l < c.head_dim; ++l) {
        o[size_t((h * n + i) * c.head_dim + l)] =
            float(DecodeElement(out.at(0, h, t0 + i, l), out.dtype));
      }
  return o;
}

struct Combo {
  headsum_dtype q, kv, out;
};
const Combo kPagedCombos[] = {
    {HEADSUM_F32, HEADSUM_F32, HEADSUM_F32},
    {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F32},
    {HEADSUM_BF16, HEADSUM_BF16, HEADSUM_BF16},
    {HEADSUM_F32, HEADSUM_F16, HEADSUM_F16},
};

class PagedAttention : public TargetTest {};

TEST_P(PagedAttention, EverySequenceMatchesReferenceOverItsBlocks) {
  uint64_t seed = 900;
  const bool small = headsum_shapes::SmallSweepRequested();
  size_t case_index = 0;
  for (const PagedCase& c : kPagedCases) {
    ++case_index;
    size_t combo_index = 0;
    for (const Combo& t : kPagedCombos) {
      if (small && (combo_index++ + case_index) % 2 != 0) continue;
      SCOPED_TRACE(std::string(c.name) + " q " + DtypeName(t.q) + " kv " + DtypeName(t.kv) +
                   " out " + DtypeName(t.out));
      PagedBuffers p = MakePaged(c, t.kv, ++seed);
      const int64_t T = p.q_offsets.back();
      const std::vector<float> q0 =
          RoundedTo(RandomUniform(size_t(T * c.heads * c.head_dim), -1.5f, 1.5f, ++seed), t.q);
      Strided q = TokenRows(t.q, T, c.heads, c.head_dim, 0xFF);
      Strided out = TokenRows(t.out, T, c.heads, c.head_dim, 0xA5);
      {
        size_t n = 0;
        for (int64_t r = 0; r < T; ++r)
          for (int64_t h = 0; h < c.heads; ++h)
            for (int64_t l = 0; l < c.head_dim; ++l) EncodeElement(q0[n++], q.at(0, h, r, l), t.q);
      }
      const std::vector<float> slopes = [&] {
        std::vector<float> s(static_cast<size_t>(c.heads));
        for (int64_t h = 0; h < c.heads; ++h) s[size_t(h)] = std::exp2(-8.0f * (h + 1) / c.heads);
        return s;
      }();
      const std::vector<float> sinks = RandomUniform(size_t(c.heads), -1.0f, 3.0f, ++seed);
      headsum_attn_options opt = {};
      opt.window = c.window;
      opt.softcap = c.softcap;
      opt.alibi_slopes = c.slopes ? slopes.data() : nullptr;
      opt.sinks = c.sinks ? sinks.data() : nullptr;
      const headsum_batch_shape shape = BatchOf(c, p);
      const headsum_paged_kv kv = KvOf(p, c, t.kv);
      const headsum_tensor tq = q.tensor(), to = out.tensor();
      const std::vector<char> k_before = p.k_pool.bytes, v_before = p.v_pool.bytes;
      const std::vector<char> out_before = out.bytes;
      std::vector<std::vector<double>> refs(c.rows.size()), bounds(c.rows.size());
      for (size_t b = 0; b < c.rows.size(); ++b) {
        if (c.rows[b] == 0) continue;
        std::vector<float> q_rows(q0.begin() + p.q_offsets[b] * c.heads * c.head_dim,
                                  q0.begin() + p.q_offsets[b + 1] * c.heads * c.head_dim);
        SequenceReference(c, p, b, q_rows, slopes, sinks, t.out, &refs[b], &bounds[b]);
      }
      // The pick, then each path of the table forced where it runs (paged
      // rows: the decode paths block by block, the block paths gathered).
      for (int path = -1; path < int(headsum::dispatch::kAttnPathCount); ++path) {
        if (small && path >= 0 && (path + int(case_index)) % 2 != 0) continue;
        SCOPED_TRACE(std::string("path ") +
                     (path < 0 ? "picked" : headsum::dispatch::AttnPaths()[path].name));
        out.bytes = out_before;
        headsum::testing::ForceAttentionPath(path);
        const headsum_status st = headsum_attention_paged(&shape, &opt, &tq, &kv, &to);
        headsum::testing::ForceAttentionPath(-1);
        ASSERT_EQ(st, HEADSUM_OK) << headsum_last_error();
        EXPECT_TRUE(k_before == p.k_pool.bytes && v_before == p.v_pool.bytes);
        for (size_t b = 0; b < c.rows.size(); ++b) {
          const int64_t n = c.rows[b];
          if (n == 0) continue;
          SCOPED_TRACE("sequence " + std::to_string(b));
          ASSERT_TRUE(AllWithinBound(refs[b], bounds[b], SequenceRows(out, c, p.q_offsets[b], n),
                                     Layout{{c.heads, n, c.head_dim}, "hil"}));
        }
      }
    }
  }
}

// New rows written into their slots (converted to the pool's dtype), then
// attended: as dense attention over all the tokens.
TEST_P(PagedAttention, WriteThenAttendIsAttentionOverAllTokens) {
  const PagedCase c = {"write", 4, 2, 32, 16, {1, 5, 0, 1}, {40, 21, 16, 17}, true, false, false};
  for (headsum_dtype kv_dtype : {HEADSUM_F32, HEADSUM_BF16, HEADSUM_F16}) {
    SCOPED_TRACE(DtypeName(kv_dtype));
    PagedBuffers p = MakePaged(c, kv_dtype, 77);
    const int64_t T = p.q_offsets.back(), G = c.kv_heads, L = c.head_dim;
    // The new rows, f32, [T][Hkv][L].
    const std::vector<float> kn = RandomUniform(size_t(T * G * L), -1.5f, 1.5f, 78);
    const std::vector<float> vn = RandomUniform(size_t(T * G * L), -1.0f, 1.0f, 79);
    Strided k_new = TokenRows(HEADSUM_F32, T, G, L, 0), v_new = TokenRows(HEADSUM_F32, T, G, L, 0);
    size_t n = 0;
    for (int64_t r = 0; r < T; ++r)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t l = 0; l < L; ++l, ++n) {
          EncodeElement(kn[n], k_new.at(0, g, r, l), HEADSUM_F32);
          EncodeElement(vn[n], v_new.at(0, g, r, l), HEADSUM_F32);
        }
    const headsum_batch_shape shape = BatchOf(c, p);
    const headsum_paged_kv kv = KvOf(p, c, kv_dtype);
    const headsum_tensor tkn = k_new.tensor(), tvn = v_new.tensor();
    ASSERT_EQ(headsum_paged_kv_write(&shape, &kv, &tkn, &tvn), HEADSUM_OK) << headsum_last_error();
    // The gathered keys now hold the new rows (rounded) at their positions.
    for (size_t b = 0; b < c.rows.size(); ++b) {
      const int64_t rows = c.rows[b], S = c.keys[b];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < G; ++g)
          for (int64_t l = 0; l < L; ++l) {
            const int64_t pos = S - rows + r, t = p.q_offsets[b] + r;
            const size_t at = size_t((g * S + pos) * L + l), src = size_t((t * G + g) * L + l);
            p.k_seq[b][at] = RoundedTo({kn[src]}, kv_dtype)[0];
            p.v_seq[b][at] = RoundedTo({vn[src]}, kv_dtype)[0];
          }
    }
    // Attend with fresh queries; compare with each sequence's reference
    // over its updated keys.
    const std::vector<float> q0 = RandomUniform(size_t(T * c.heads * L), -1.5f, 1.5f, 80);
    Strided q = TokenRows(HEADSUM_F32, T, c.heads, L, 0), out = TokenRows(HEADSUM_F32, T, c.heads, L, 0xA5);
    n = 0;
    for (int64_t r = 0; r < T; ++r)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t l = 0; l < L; ++l) EncodeElement(q0[n++], q.at(0, h, r, l), HEADSUM_F32);
    const headsum_tensor tq = q.tensor(), to = out.tensor();
    ASSERT_EQ(headsum_attention_paged(&shape, nullptr, &tq, &kv, &to), HEADSUM_OK);
    // The pool itself holds the new rows in the pool's dtype.
    for (size_t b = 0; b < c.rows.size(); ++b) {
      const int64_t rows = c.rows[b];
      if (rows == 0) continue;
      std::vector<float> q_rows(q0.begin() + p.q_offsets[b] * c.heads * L,
                                q0.begin() + p.q_offsets[b + 1] * c.heads * L);
      std::vector<double> ref, bound;
      SequenceReference(c, p, b, q_rows, {}, {}, HEADSUM_F32, &ref, &bound);
      ASSERT_TRUE(AllWithinBound(ref, bound, SequenceRows(out, c, p.q_offsets[b], rows),
                                 Layout{{c.heads, rows, L}, "hil"}));
    }
  }
}

TEST_P(PagedAttention, DeterministicAcrossThreadCounts) {
  const PagedCase& c = kPagedCases[2];
  PagedBuffers p = MakePaged(c, HEADSUM_BF16, 5);
  const int64_t T = p.q_offsets.back();
  Strided q = TokenRows(HEADSUM_F32, T, c.heads, c.head_dim, 0);
  q.Fill(RandomUniform(size_t(T * c.heads * c.head_dim), -1.5f, 1.5f, 6));
  const headsum_batch_shape shape = BatchOf(c, p);
  const headsum_paged_kv kv = KvOf(p, c, HEADSUM_BF16);
  std::vector<char> first;
  for (int threads : {1, 2, 3, 7}) {
    ASSERT_EQ(headsum_set_num_threads(threads), HEADSUM_OK);
    Strided out = TokenRows(HEADSUM_F32, T, c.heads, c.head_dim, 0);
    const headsum_tensor tq = q.tensor(), to = out.tensor();
    ASSERT_EQ(headsum_attention_paged(&shape, nullptr, &tq, &kv, &to), HEADSUM_OK);
    if (first.empty()) {
      first = out.bytes;
    } else {
      EXPECT_TRUE(first == out.bytes) << threads << " threads";
    }
  }
  headsum_set_num_threads(0);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(PagedAttention);

// Every rule, each named in the message, nothing written.
TEST(PagedAttentionInvalid, EveryRuleIsNamedAndNothingIsWritten) {
  const PagedCase c = {"rules", 2, 1, 8, 4, {1, 2}, {5, 6}, true, false, false};
  PagedBuffers p = MakePaged(c, HEADSUM_F32, 11);
  const int64_t T = p.q_offsets.back();
  Strided q = TokenRows(HEADSUM_F32, T, c.heads, c.head_dim, 0);
  Strided out = TokenRows(HEADSUM_F32, T, c.heads, c.head_dim, 0xA5);
  Strided kn = TokenRows(HEADSUM_F32, T, c.kv_heads, c.head_dim, 0);
  const headsum_tensor tq = q.tensor(), to = out.tensor(), tkn = kn.tensor();
  const std::vector<char> out_before = out.bytes, k_before = p.k_pool.bytes;
  struct Rule {
    const char* what;
    headsum_batch_shape shape;
    headsum_paged_kv kv;
    const char* named;
  };
  std::vector<Rule> rules;
  const headsum_batch_shape good = BatchOf(c, p);
  const headsum_paged_kv good_kv = KvOf(p, c, HEADSUM_F32);
  static const int64_t bad_start[3] = {1, 2, 3}, decreasing[3] = {0, 2, 1};
  static const int64_t too_few_keys[2] = {0, 6}, negative[2] = {-1, 6};
  std::vector<int32_t> bad_table = p.table;
  // Sequence 1's second block: both calls use it (the write: its positions 4 and 5).
  bad_table[size_t(p.blocks_per_seq + 1)] = int32_t(p.num_blocks);
  {
    Rule r{"q_offsets[0] != 0", good, good_kv, "q_offsets[0] = 1"};
    r.shape.q_offsets = bad_start;
    rules.push_back(r);
  }
  {
    Rule r{"q_offsets decreasing", good, good_kv, "q_offsets[2] = 1"};
    r.shape.q_offsets = decreasing;
    rules.push_back(r);
  }
  {
    Rule r{"n_b > kv_lens", good, good_kv, "kv_lens[0] = 0"};
    r.shape.kv_lens = too_few_keys;
    rules.push_back(r);
  }
  {
    Rule r{"kv_lens < 0", good, good_kv, "kv_lens[0] = -1"};
    r.shape.kv_lens = negative;
    rules.push_back(r);
  }
  {
    Rule r{"block_table entry out of range", good, good_kv, "block_table[1][1]"};
    r.kv.block_table = bad_table.data();
    rules.push_back(r);
  }
  {
    Rule r{"block_size < 1", good, good_kv, "kv->block_size = 0"};
    r.kv.block_size = 0;
    rules.push_back(r);
  }
  {
    Rule r{"blocks too few", good, good_kv, "blocks_per_seq"};
    r.kv.block_size = 1;
    rules.push_back(r);
  }
  {
    Rule r{"NULL table", good, good_kv, "kv->block_table is NULL"};
    r.kv.block_table = nullptr;
    rules.push_back(r);
  }
  {
    Rule r{"pool stride negative", good, good_kv, "kv->k"};
    r.kv.strides[1] = -1;
    rules.push_back(r);
  }
  {
    // q_offsets[2] - q_offsets[1] overflows int64: refused for the order
    // without computing it (UBSan flagged the difference; the fuzz harness).
    static const int64_t wrapping[3] = {0, 1, INT64_MIN};
    Rule r{"q_offsets decreasing to INT64_MIN", good, good_kv, "q_offsets[2]"};
    r.shape.q_offsets = wrapping;
    rules.push_back(r);
  }
  {
    // Any int in the field (a C caller can store one), read without an enum
    // load (UBSan's -fsanitize=enum flagged kv->dtype copied as the enum).
    Rule r{"pool dtype unknown", good, good_kv, "kv->k->dtype = 7"};
    const int seven = 7;
    memcpy(&r.kv.dtype, &seven, sizeof(int));
    rules.push_back(r);
  }
  for (const Rule& r : rules) {
    SCOPED_TRACE(r.what);
    EXPECT_EQ(headsum_attention_paged(&r.shape, nullptr, &tq, &r.kv, &to),
              HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find(r.named), std::string::npos)
        << headsum_last_error();
    EXPECT_EQ(headsum_paged_kv_write(&r.shape, &r.kv, &tkn, &tkn), HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find(r.named), std::string::npos)
        << headsum_last_error();
    EXPECT_TRUE(out.bytes == out_before);
    EXPECT_TRUE(p.k_pool.bytes == k_before);
  }
  // An entry past a sequence's blocks is never read (the -7 entries).
  EXPECT_EQ(headsum_attention_paged(&good, nullptr, &tq, &good_kv, &to), HEADSUM_OK)
      << headsum_last_error();
  out.bytes = out_before;
  // out meeting q or a pool.
  const headsum_tensor on_q = q.tensor();
  EXPECT_EQ(headsum_attention_paged(&good, nullptr, &tq, &good_kv, &on_q),
            HEADSUM_ERR_INVALID_ARGUMENT);
  headsum_tensor on_pool = to;
  on_pool.data = p.k_pool.base();
  EXPECT_EQ(headsum_attention_paged(&good, nullptr, &tq, &good_kv, &on_pool),
            HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(headsum_last_error()).find("kv->k"), std::string::npos);
  // Two sequences writing one shared slot.
  {
    std::vector<int32_t> shared = p.table;
    // Sequence 0 (5 keys, writes position 4 in its block 1) and sequence 1
    // (6 keys, writes 4 and 5 in its block 1): both block 1 the same block.
    shared[size_t(p.blocks_per_seq + 1)] = shared[1];
    headsum_paged_kv kv = good_kv;
    kv.block_table = shared.data();
    EXPECT_EQ(headsum_paged_kv_write(&good, &kv, &tkn, &tkn), HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find("slot"), std::string::npos)
        << headsum_last_error();
    EXPECT_TRUE(p.k_pool.bytes == k_before);
  }
  // New rows inside the pool.
  headsum_tensor in_pool = tkn;
  in_pool.data = p.k_pool.base();
  EXPECT_EQ(headsum_paged_kv_write(&good, &good_kv, &in_pool, &tkn), HEADSUM_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(p.k_pool.bytes == k_before);
  // K and V pools on one memory, or a slot stride of 0 (two slots of a
  // block on the same bytes): the destinations meet (the fuzz harness found
  // both written, whichever last).
  for (int alias = 0; alias < 2; ++alias) {
    headsum_paged_kv kv = good_kv;
    if (alias == 0) {
      kv.v = kv.k;
    } else {
      kv.strides[1] = 0;
    }
    EXPECT_EQ(headsum_paged_kv_write(&good, &kv, &tkn, &tkn), HEADSUM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(headsum_last_error()).find("meet"), std::string::npos)
        << headsum_last_error();
    EXPECT_TRUE(p.k_pool.bytes == k_before);
  }
  // Blocks of INT64_MAX slots (a slot stride of 0 keeps the pool
  // addressable): blocks_per_seq * block_size passes INT64_MAX, every
  // sequence uses one block, and the call is valid.
  {
    headsum_paged_kv kv = good_kv;
    kv.block_size = INT64_MAX;
    kv.strides[1] = 0;
    EXPECT_EQ(headsum_attention_paged(&good, nullptr, &tq, &kv, &to), HEADSUM_OK)
        << headsum_last_error();
    out.bytes = out_before;
  }
  // A write checks the entries of the blocks written only: sequence 1 (6
  // keys, its second block partly filled) writes no row, so its bad entry
  // table[1][1] is neither read nor refused (the fuzz harness found it read).
  {
    static const int64_t one_row[3] = {0, 1, 1};
    headsum_batch_shape shape = good;
    shape.q_offsets = one_row;
    headsum_paged_kv kv = good_kv;
    kv.block_table = bad_table.data();
    EXPECT_EQ(headsum_paged_kv_write(&shape, &kv, &tkn, &tkn), HEADSUM_OK) << headsum_last_error();
  }
}

}  // namespace
}  // namespace headsum_test
