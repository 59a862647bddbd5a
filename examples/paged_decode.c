/* Continuous batching over a paged bf16 KV cache, in plain C11, the way a
 * serving engine runs it: a pool of fixed-size blocks and a free list;
 * sequences join with a prompt (prefilled in chunks), decode one token a
 * step, and leave, returning their blocks; every step is one
 * headsum_paged_kv_write (the step's new K/V rows, f32 -> bf16, into their
 * slots) and one headsum_attention_paged over the whole ragged batch
 * (decode rows and prefill chunks together).  Prints tokens per second.
 *
 *   paged_decode [steps] [max_batch]   (default 200 and 8)
 *
 * Shapes: H = 8 query heads over Hkv = 2 kv heads (GQA), L = 64, blocks of
 * 16 tokens, prompts of 100..900 tokens, 50..250 new tokens each.  The
 * "model" is random rows: this shows the calls and the bookkeeping. */
#include <headsum/headsum.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 8, HKV = 2, L = 64, BLOCK = 16, NUM_BLOCKS = 4096, MAX_BLOCKS_PER_SEQ = 80,
       MAX_BATCH = 64, PREFILL_CHUNK = 256 };

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static unsigned rng = 12345u;
static unsigned next_random(void) {
  rng = rng * 1664525u + 1013904223u;
  return rng >> 8;
}
static void fill_random(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = (float)next_random() / 8388608.0f - 1.0f;
}

#define CHECK(call)                                                    \
  do {                                                                 \
    if ((call) != HEADSUM_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, headsum_last_error()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

typedef struct {
  int64_t prompt, to_generate, len; /* len: tokens in the cache */
  int32_t blocks[MAX_BLOCKS_PER_SEQ];
  int64_t n_blocks;
} Sequence;

static int32_t free_list[NUM_BLOCKS];
static int64_t free_count = 0;

/* Enough blocks for `tokens` tokens; 0 when the pool is out of blocks. */
static int reserve(Sequence* s, int64_t tokens) {
  while (s->n_blocks * BLOCK < tokens) {
    if (free_count == 0 || s->n_blocks == MAX_BLOCKS_PER_SEQ) return 0;
    s->blocks[s->n_blocks++] = free_list[--free_count];
  }
  return 1;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 200;
  int max_batch = argc > 2 ? atoi(argv[2]) : 8;
  if (max_batch < 1 || max_batch > MAX_BATCH) max_batch = 8;
  /* The pools, [NUM_BLOCKS][BLOCK][HKV][L] bf16. */
  const size_t pool_elems = (size_t)NUM_BLOCKS * BLOCK * HKV * L;
  uint16_t* k_pool = calloc(pool_elems, sizeof(uint16_t));
  uint16_t* v_pool = calloc(pool_elems, sizeof(uint16_t));
  for (int32_t b = 0; b < NUM_BLOCKS; ++b) free_list[free_count++] = NUM_BLOCKS - 1 - b;
  /* Per step: up to max_batch sequences, each a prefill chunk or a token. */
  const size_t max_rows = (size_t)max_batch * PREFILL_CHUNK;
  float* q = malloc(max_rows * H * L * sizeof(float));
  float* out = malloc(max_rows * H * L * sizeof(float));
  float* k_new = malloc(max_rows * HKV * L * sizeof(float));
  float* v_new = malloc(max_rows * HKV * L * sizeof(float));
  int32_t* table = malloc((size_t)max_batch * MAX_BLOCKS_PER_SEQ * sizeof(int32_t));
  Sequence seqs[MAX_BATCH];
  int active = 0;
  int64_t q_offsets[MAX_BATCH + 1], kv_lens[MAX_BATCH];
  long long generated = 0, prefilled = 0, finished = 0;
  double attend_seconds = 0.0;
  const double t0 = now_seconds();
  for (int step = 0; step < steps; ++step) {
    /* Join: new sequences while there is room. */
    while (active < max_batch) {
      Sequence* s = &seqs[active];
      memset(s, 0, sizeof(*s));
      s->prompt = 100 + (int64_t)(next_random() % 801);
      s->to_generate = 50 + (int64_t)(next_random() % 201);
      if (!reserve(s, s->prompt + s->to_generate)) { /* pool full: give back, wait */
        for (int64_t n = 0; n < s->n_blocks; ++n) free_list[free_count++] = s->blocks[n];
        break;
      }
      ++active;
    }
    /* This step's rows: the next prefill chunk, or one decode token. */
    q_offsets[0] = 0;
    for (int b = 0; b < active; ++b) {
      Sequence* s = &seqs[b];
      const int64_t left = s->prompt - s->len;
      const int64_t n = left > 0 ? (left < PREFILL_CHUNK ? left : PREFILL_CHUNK) : 1;
      s->len += n;
      kv_lens[b] = s->len;
      q_offsets[b + 1] = q_offsets[b] + n;
      memcpy(table + (size_t)b * MAX_BLOCKS_PER_SEQ, s->blocks,
             (size_t)s->n_blocks * sizeof(int32_t));
      if (left > 0) prefilled += n; else ++generated;
    }
    const int64_t T = q_offsets[active];
    fill_random(q, (size_t)T * H * L);
    fill_random(k_new, (size_t)T * HKV * L);
    fill_random(v_new, (size_t)T * HKV * L);
    headsum_batch_shape shape = {active, H, HKV, L, 0.0f, 1, q_offsets, kv_lens};
    headsum_paged_kv kv = {k_pool, v_pool, HEADSUM_BF16, NUM_BLOCKS, BLOCK,
                           {BLOCK * HKV * L, HKV * L, L}, table, MAX_BLOCKS_PER_SEQ};
    /* Token-major rows [T][heads][L]: strides {unused, L, heads * L}. */
    headsum_tensor tq = {q, HEADSUM_F32, {0, L, H * L}};
    headsum_tensor to = {out, HEADSUM_F32, {0, L, H * L}};
    headsum_tensor tk = {k_new, HEADSUM_F32, {0, L, HKV * L}};
    headsum_tensor tv = {v_new, HEADSUM_F32, {0, L, HKV * L}};
    const double a0 = now_seconds();
    CHECK(headsum_paged_kv_write(&shape, &kv, &tk, &tv));
    CHECK(headsum_attention_paged(&shape, NULL, &tq, &kv, &to));
    attend_seconds += now_seconds() - a0;
    /* Leave: sequences that generated all their tokens return their blocks. */
    for (int b = 0; b < active;) {
      Sequence* s = &seqs[b];
      if (s->len >= s->prompt + s->to_generate) {
        for (int64_t n = 0; n < s->n_blocks; ++n) free_list[free_count++] = s->blocks[n];
        seqs[b] = seqs[--active];
        ++finished;
      } else {
        ++b;
      }
    }
  }
  const double total = now_seconds() - t0;
  printf("paged_decode: %d steps, %lld sequences finished, %lld prompt tokens prefilled, "
         "%lld tokens generated\n", steps, finished, prefilled, generated);
  printf("  attention + cache writes: %.3f s (%.0f generated tokens/s, %.0f tokens/s in all); "
         "whole loop %.3f s; target %s\n",
         attend_seconds, (double)generated / attend_seconds,
         (double)(generated + prefilled) / attend_seconds, total, headsum_active_target());
  free(k_pool);
  free(v_pool);
  free(q);
  free(out);
  free(k_new);
  free(v_new);
  free(table);
  return 0;
}
