// The C API of ragged batches over a paged KV cache: headsum_attention_paged
// and headsum_paged_kv_write.  Every rule of DESIGN.md checked here, each
// named in the message, before anything is written.
#include <inttypes.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dispatch/entry.h"
#include "dispatch/ops.h"
#include "dispatch/validate.h"
#include "headsum/headsum.h"
#include "kernels/shapes.h"

using namespace headsum::dispatch;
using headsum::AttnDims;
using headsum::AttnOptions;
using headsum::TensorView;

namespace {

constexpr bool kTokenRows[3] = {false, true, true};  // [T][H][L]: strides[1], strides[2]
constexpr bool kPoolStrides[3] = {true, true, true};

// The batch shape: dims >= 1, kv_heads dividing heads, q_offsets from 0
// and non-decreasing, 0 <= n_b <= kv_lens[b].  Fills everything of *p but
// the pools; *rows the total T, *max_rows and *max_keys the largest n_b and
// kv_lens[b] (a bias's extents).
headsum_status CheckBatchShape(const char* fn, const headsum_batch_shape* shape, PagedBatch* p,
                               int64_t* rows, int64_t* max_rows, int64_t* max_keys) {
  HEADSUM_CHECK(CheckPointer(fn, "shape", shape));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "shape->batch", shape->batch));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "shape->heads", shape->heads));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "shape->head_dim", shape->head_dim));
  if (shape->kv_heads < 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "shape->kv_heads = %" PRId64 " must be >= 0 (0 means = heads)", shape->kv_heads);
  }
  const int64_t kv_heads = shape->kv_heads == 0 ? shape->heads : shape->kv_heads;
  if (shape->heads % kv_heads != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                "shape->kv_heads = %" PRId64 " does not divide shape->heads = %" PRId64,
                kv_heads, shape->heads);
  }
  if (!std::isfinite(shape->scale)) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "shape->scale = %g is not finite",
                static_cast<double>(shape->scale));
  }
  HEADSUM_CHECK(CheckPointer(fn, "shape->q_offsets", shape->q_offsets));
  HEADSUM_CHECK(CheckPointer(fn, "shape->kv_lens", shape->kv_lens));
  if (shape->q_offsets[0] != 0) {
    return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn, "shape->q_offsets[0] = %" PRId64 " must be 0",
                shape->q_offsets[0]);
  }
  *max_rows = 0;
  *max_keys = 0;
  for (int64_t b = 0; b < shape->batch; ++b) {
    // Order first: q_offsets[b] >= 0 holds here (from q_offsets[0] = 0), so
    // the difference of an ordered pair cannot overflow.
    if (shape->q_offsets[b + 1] < shape->q_offsets[b]) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                  "shape->q_offsets[%" PRId64 "] = %" PRId64 " is below q_offsets[%" PRId64
                  "] = %" PRId64 " (they must not decrease)",
                  b + 1, shape->q_offsets[b + 1], b, shape->q_offsets[b]);
    }
    const int64_t n = shape->q_offsets[b + 1] - shape->q_offsets[b];
    if (shape->kv_lens[b] < 0) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                  "shape->kv_lens[%" PRId64 "] = %" PRId64 " must be >= 0", b, shape->kv_lens[b]);
    }
    if (n > shape->kv_lens[b]) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                  "sequence %" PRId64 " has %" PRId64 " query rows (q_offsets[%" PRId64
                  "] - q_offsets[%" PRId64 "]) but kv_lens[%" PRId64 "] = %" PRId64
                  " keys: its rows must be among its keys (n_b <= kv_lens[b])",
                  b, n, b + 1, b, b, shape->kv_lens[b]);
    }
    *max_rows = std::max(*max_rows, n);
    *max_keys = std::max(*max_keys, shape->kv_lens[b]);
  }
  *rows = shape->q_offsets[shape->batch];
  p->batch = static_cast<size_t>(shape->batch);
  p->heads = static_cast<size_t>(shape->heads);
  p->kv_heads = static_cast<size_t>(kv_heads);
  p->head_dim = static_cast<size_t>(shape->head_dim);
  p->scale = shape->scale != 0.0f
                 ? shape->scale
                 : static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape->head_dim)));
  p->causal = shape->causal != 0;
  p->q_offsets = shape->q_offsets;
  p->kv_lens = shape->kv_lens;
  return HEADSUM_OK;
}

// The paged cache: block_size >= 1, num_blocks >= 1, blocks_per_seq *
// block_size covering every kv_lens[b], every block_table entry a sequence
// uses in [0, num_blocks), the pools addressable views of
// [num_blocks][block_size][Hkv][L].
// (A write checks the blocks it writes: those of each sequence's last n_b
// positions.)
headsum_status CheckPagedKv(const char* fn, const headsum_paged_kv* kv, PagedBatch* p,
                            ByteRange* k_range, ByteRange* v_range, bool written_only) {
  HEADSUM_CHECK(CheckPointer(fn, "kv", kv));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "kv->block_size", kv->block_size));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "kv->num_blocks", kv->num_blocks));
  HEADSUM_CHECK(CheckAtLeastOne(fn, "kv->blocks_per_seq", kv->blocks_per_seq));
  HEADSUM_CHECK(CheckPointer(fn, "kv->block_table", kv->block_table));
  uint64_t table_entries;
  HEADSUM_CHECK(CheckElements(fn, "kv->block_table", &table_entries,
                              static_cast<int64_t>(p->batch), kv->blocks_per_seq));
  for (size_t b = 0; b < p->batch; ++b) {
    const int64_t len = p->kv_lens[b];
    // The blocks it uses, ceil(len / block_size), without overflow (len >= 0,
    // block_size >= 1; blocks_per_seq * block_size may pass INT64_MAX).
    const int64_t used = len / kv->block_size + (len % kv->block_size != 0 ? 1 : 0);
    if (used > kv->blocks_per_seq) {
      return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                  "kv_lens[%zu] = %" PRId64 " keys do not fit blocks_per_seq = %" PRId64
                  " blocks of block_size = %" PRId64,
                  b, len, kv->blocks_per_seq, kv->block_size);
    }
    const int64_t n_rows = p->q_offsets[b + 1] - p->q_offsets[b];
    // A sequence that writes no row writes no block: none of its entries is
    // read (len / block_size would be its partly filled last block).
    if (written_only && n_rows == 0) continue;
    const int64_t first_written = len - n_rows;
    for (int64_t n = written_only ? first_written / kv->block_size : 0; n < used; ++n) {
      const int32_t e = kv->block_table[static_cast<int64_t>(b) * kv->blocks_per_seq + n];
      if (e < 0 || e >= kv->num_blocks) {
        return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                    "kv->block_table[%zu][%" PRId64 "] = %d is outside [0, num_blocks = %" PRId64
                    ") (sequence %zu uses %" PRId64 " blocks)",
                    b, n, static_cast<int>(e), kv->num_blocks, b, used);
      }
    }
  }
  // Each pool as a view [num_blocks][Hkv][block_size][L] (strides block,
  // kv head, slot).
  const int64_t dims[4] = {kv->num_blocks, static_cast<int64_t>(p->kv_heads), kv->block_size,
                           static_cast<int64_t>(p->head_dim)};
  for (int i = 0; i < 2; ++i) {
    headsum_tensor t;
    t.data = i == 0 ? kv->k : kv->v;
    // The field may hold any int (CheckTensor reads it as one): no enum load.
    memcpy(&t.dtype, &kv->dtype, sizeof(t.dtype));
    t.strides[0] = kv->strides[0];
    t.strides[1] = kv->strides[2];
    t.strides[2] = kv->strides[1];
    HEADSUM_CHECK(CheckTensor(fn, i == 0 ? "kv->k" : "kv->v", &t, dims, kPoolStrides, false,
                              i == 0 ? &p->k : &p->v, i == 0 ? k_range : v_range));
  }
  p->block_table = kv->block_table;
  p->blocks_per_seq = static_cast<size_t>(kv->blocks_per_seq);
  p->block_rows = static_cast<size_t>(kv->block_size);
  p->block_stride = p->k.sb;
  p->k.sb = p->v.sb = 0;
  return HEADSUM_OK;
}

// Token rows [T][n][L] (strides[1] the head, strides[2] the token).
headsum_status CheckTokenRows(const char* fn, const char* name, const headsum_tensor* t,
                              int64_t rows, size_t heads, size_t head_dim, bool is_output,
                              TensorView* view, ByteRange* range) {
  const int64_t dims[4] = {1, static_cast<int64_t>(heads), rows, static_cast<int64_t>(head_dim)};
  HEADSUM_CHECK(CheckTensor(fn, name, t, dims, kTokenRows, is_output, view, range));
  view->sb = 0;
  return HEADSUM_OK;
}

}  // namespace

extern "C" {

headsum_status headsum_attention_paged(const headsum_batch_shape* shape,
                                       const headsum_attn_options* options,
                                       const headsum_tensor* q, const headsum_paged_kv* kv,
                                       const headsum_tensor* out) {
  PagedBatch p;
  int64_t rows = 0, max_rows = 0, max_keys = 0;
  ByteRange k_range, v_range, q_range, out_range;
  TensorView q_view, out_view;
  AttnDims a;  // carries the window and options
  AttnOptions opt;
  return Entry("headsum_attention_paged")
      .Check(CheckBatchShape, shape, &p, &rows, &max_rows, &max_keys)
      .Check(CheckPagedKv, kv, &p, &k_range, &v_range, false)
      .Check([&](const char* fn) -> headsum_status {
        if (rows == 0) return HEADSUM_OK;  // no query rows: nothing to read or write
        HEADSUM_CHECK(CheckTokenRows(fn, "q", q, rows, p.heads, p.head_dim, false, &q_view,
                                     &q_range));
        HEADSUM_CHECK(CheckTokenRows(fn, "out", out, rows, p.heads, p.head_dim, true, &out_view,
                                     &out_range));
        HEADSUM_CHECK(CheckDisjoint(fn, "out", out_range, "q", q_range));
        HEADSUM_CHECK(CheckDisjoint(fn, "out", out_range, "kv->k", k_range));
        return CheckDisjoint(fn, "out", out_range, "kv->v", v_range);
      })
      .Check([&](const char* fn) {
        return CheckAttnOptions(fn, options, static_cast<int64_t>(p.batch),
                                static_cast<int64_t>(p.heads), std::max<int64_t>(max_rows, 1),
                                std::max<int64_t>(max_keys, 1), rows == 0 ? nullptr : &out_range,
                                nullptr, &a, &opt);
      })
      .Run([&] {
        if (rows == 0) return HEADSUM_OK;
        return AttentionPaged(p, a.window, a.opt, q_view, out_view);
      });
}

headsum_status headsum_paged_kv_write(const headsum_batch_shape* shape,
                                      const headsum_paged_kv* kv, const headsum_tensor* k_new,
                                      const headsum_tensor* v_new) {
  PagedBatch p;
  int64_t rows = 0, max_rows = 0, max_keys = 0;
  ByteRange k_range, v_range, kn_range, vn_range;
  TensorView kn_view, vn_view;
  return Entry("headsum_paged_kv_write")
      .Check(CheckBatchShape, shape, &p, &rows, &max_rows, &max_keys)
      .Check(CheckPagedKv, kv, &p, &k_range, &v_range, true)
      .Check([&](const char* fn) -> headsum_status {
        if (rows == 0) return HEADSUM_OK;
        HEADSUM_CHECK(CheckTokenRows(fn, "k_new", k_new, rows, p.kv_heads, p.head_dim, false,
                                     &kn_view, &kn_range));
        HEADSUM_CHECK(CheckTokenRows(fn, "v_new", v_new, rows, p.kv_heads, p.head_dim, false,
                                     &vn_view, &vn_range));
        for (const ByteRange* pool : {&k_range, &v_range}) {
          const char* name = pool == &k_range ? "kv->k" : "kv->v";
          HEADSUM_CHECK(CheckDisjoint(fn, name, *pool, "k_new", kn_range));
          HEADSUM_CHECK(CheckDisjoint(fn, name, *pool, "v_new", vn_range));
        }
        // No two new rows may land in one slot (a block shared by two
        // sequences both writing it).
        thread_local std::vector<std::pair<uint64_t, uint64_t>> slots;  // (slot, row)
        slots.clear();
        for (size_t b = 0; b < p.batch; ++b) {
          const int64_t n = p.q_offsets[b + 1] - p.q_offsets[b];
          for (int64_t r = 0; r < n; ++r) {
            const int64_t pos = p.kv_lens[b] - n + r;
            const int64_t block = p.block_table[b * p.blocks_per_seq +
                                                static_cast<size_t>(pos) / p.block_rows];
            slots.emplace_back(static_cast<uint64_t>(block) * p.block_rows +
                                   static_cast<uint64_t>(pos) % p.block_rows,
                               static_cast<uint64_t>(p.q_offsets[b] + r));
          }
        }
        std::sort(slots.begin(), slots.end());
        for (size_t i = 1; i < slots.size(); ++i) {
          if (slots[i].first == slots[i - 1].first) {
            return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                        "new rows %" PRIu64 " and %" PRIu64 " would both be written to slot %" PRIu64
                        " of block %" PRIu64 " (destination slots must not meet)",
                        slots[i - 1].second, slots[i].second, slots[i].first % p.block_rows,
                        slots[i].first / p.block_rows);
          }
        }
        // Nor may two written rows (each kv head's L elements, in K and in V)
        // meet in memory: K and V pools that alias, or strides under which
        // distinct slots or heads share bytes, would leave whichever row was
        // written last.
        struct Written { uintptr_t lo, hi; uint64_t row; int pool; };  // bytes [lo, hi)
        thread_local std::vector<Written> rows_written;
        rows_written.clear();
        const uint64_t bytes = DTypeBytes(p.k.dtype);
        for (const auto& slot : slots) {
          const uint64_t block = slot.first / p.block_rows, s = slot.first % p.block_rows;
          for (int i = 0; i < 2; ++i) {
            const uintptr_t base = reinterpret_cast<uintptr_t>(i == 0 ? kv->k : kv->v);
            for (size_t g = 0; g < p.kv_heads; ++g) {
              const uint64_t at = (block * static_cast<uint64_t>(kv->strides[0]) +
                                   s * static_cast<uint64_t>(kv->strides[1]) +
                                   g * static_cast<uint64_t>(kv->strides[2])) * bytes;
              rows_written.push_back({base + at, base + at + p.head_dim * bytes, slot.second, i});
            }
          }
        }
        std::sort(rows_written.begin(), rows_written.end(),
                  [](const Written& x, const Written& y) { return x.lo < y.lo; });
        for (size_t i = 1; i < rows_written.size(); ++i) {
          const Written& x = rows_written[i - 1];
          const Written& y = rows_written[i];
          if (y.lo < x.hi) {
            return Fail(HEADSUM_ERR_INVALID_ARGUMENT, fn,
                        "new row %" PRIu64 " of %s and new row %" PRIu64
                        " of %s would be written to bytes that meet (destination slots must "
                        "not meet: kv->k and kv->v alias, or the strides {%" PRId64 ", %" PRId64
                        ", %" PRId64 "} make slots or heads share memory)",
                        x.row, x.pool == 0 ? "K" : "V", y.row, y.pool == 0 ? "K" : "V",
                        kv->strides[0], kv->strides[1], kv->strides[2]);
          }
        }
        return HEADSUM_OK;
      })
      .Run([&] {
        if (rows == 0) return HEADSUM_OK;
        return PagedKvWrite(p, kn_view, vn_view);
      });
}

}  // extern "C"
