/* Token-by-token decode over a bf16 KV cache, in plain C11, the way an
 * engine holds its memory: one fused, token-major QKV buffer per step (as a
 * QKV projection writes it), a K/V cache allocated for its full capacity in
 * bf16 and filled to the current length, and the new token's K and V
 * appended with one headsum_convert each.  Prints tokens per second.
 *
 *   kv_cache_decode [prompt_tokens] [new_tokens]   (default 2048 and 256)
 *
 * Shapes: H = 8 query heads over Hkv = 2 kv heads (GQA), L = 64. */
#include <headsum/headsum.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill_random(float* x, size_t n, unsigned* state) {
  for (size_t i = 0; i < n; ++i) {
    *state = *state * 1664525u + 1013904223u;
    x[i] = (float)(*state >> 8) / 8388608.0f - 1.0f;
  }
}

#define CHECK(call)                                                  \
  do {                                                               \
    if ((call) != HEADSUM_OK) {                                      \
      fprintf(stderr, "%s failed: %s\n", #call, headsum_last_error()); \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main(int argc, char** argv) {
  const int64_t prompt = argc > 1 ? atoll(argv[1]) : 2048;
  const int64_t steps = argc > 2 ? atoll(argv[2]) : 256;
  const int64_t B = 1, H = 8, Hkv = 2, L = 64, cap = prompt + steps;
  if (prompt < 1 || steps < 1) {
    fprintf(stderr, "usage: kv_cache_decode [prompt_tokens >= 1] [new_tokens >= 1]\n");
    return 2;
  }
  const int64_t W = (H + 2 * Hkv) * L; /* one token's fused q|k|v */
  unsigned state = 7;

  /* The cache: [B][Hkv][cap][L] bf16 for K and for V. */
  uint16_t* k_cache = malloc((size_t)(B * Hkv * cap * L) * sizeof(uint16_t));
  uint16_t* v_cache = malloc((size_t)(B * Hkv * cap * L) * sizeof(uint16_t));
  float* qkv = malloc((size_t)(B * prompt * W) * sizeof(float)); /* [B][S][H+2Hkv][L] */
  float* out = malloc((size_t)(B * prompt * H * L) * sizeof(float)); /* [B][S][H][L] */
  if (!k_cache || !v_cache || !qkv || !out) return 1;

  /* Views: q, k, v of the fused buffer (token-major), the cache, out. */
  headsum_tensor k_cache_t = headsum_bhsd(k_cache, HEADSUM_BF16, Hkv, cap, L);
  headsum_tensor v_cache_t = headsum_bhsd(v_cache, HEADSUM_BF16, Hkv, cap, L);

  /* Prefill: the prompt's K and V into the cache, attention over them. */
  fill_random(qkv, (size_t)(B * prompt * W), &state);
  headsum_tensor q = {qkv, HEADSUM_F32, {prompt * W, L, W}};
  headsum_tensor k = {qkv + H * L, HEADSUM_F32, {prompt * W, L, W}};
  headsum_tensor v = {qkv + (H + Hkv) * L, HEADSUM_F32, {prompt * W, L, W}};
  headsum_tensor o = headsum_bshd(out, HEADSUM_F32, H, prompt, L);
  const int64_t append_prompt[4] = {B, Hkv, prompt, L};
  CHECK(headsum_convert(append_prompt, &k, &k_cache_t));
  CHECK(headsum_convert(append_prompt, &v, &v_cache_t));
  headsum_attn_shape shape = {B, H, Hkv, prompt, prompt, L, 0.0f, 1};
  const double t0 = now_seconds();
  CHECK(headsum_attention_tensors(&shape, &q, &k_cache_t, &v_cache_t, &o));
  const double t_prefill = now_seconds() - t0;

  /* Decode: one token at a time; its K and V go to position len. */
  const int64_t append_one[4] = {B, Hkv, 1, L};
  double t_decode = 0;
  for (int64_t len = prompt; len < cap; ++len) {
    fill_random(qkv, (size_t)(B * W), &state); /* the new token's q|k|v */
    headsum_tensor q1 = {qkv, HEADSUM_F32, {W, L, W}};
    headsum_tensor k1 = {qkv + H * L, HEADSUM_F32, {W, L, W}};
    headsum_tensor v1 = {qkv + (H + Hkv) * L, HEADSUM_F32, {W, L, W}};
    headsum_tensor k_at = k_cache_t, v_at = v_cache_t;
    k_at.data = k_cache + len * L; /* position len of (b 0, kv head 0) */
    v_at.data = v_cache + len * L;
    headsum_tensor o1 = headsum_bshd(out, HEADSUM_F32, H, 1, L);
    const double t = now_seconds();
    CHECK(headsum_convert(append_one, &k1, &k_at));
    CHECK(headsum_convert(append_one, &v1, &v_at));
    headsum_attn_shape step = {B, H, Hkv, 1, len + 1, L, 0.0f, 1};
    CHECK(headsum_attention_tensors(&step, &q1, &k_cache_t, &v_cache_t, &o1));
    t_decode += now_seconds() - t;
  }
  double checksum = 0;
  for (int64_t i = 0; i < H * L; ++i) checksum += out[i];

  printf("target %s; bf16 KV cache of %lld tokens (H=%lld, Hkv=%lld, L=%lld: %.1f MiB)\n",
         headsum_active_target(), (long long)cap, (long long)H, (long long)Hkv, (long long)L,
         2.0 * (double)(B * Hkv * cap * L) * 2.0 / (1 << 20));
  printf("prefill %lld tokens: %.2f ms\n", (long long)prompt, 1e3 * t_prefill);
  printf("decode %lld tokens: %.1f us per token, %.0f tokens/s (attention + cache append)\n",
         (long long)steps, 1e6 * t_decode / (double)steps, (double)steps / t_decode);
  printf("checksum %.6f\n", checksum);
  free(k_cache);
  free(v_cache);
  free(qkv);
  free(out);
  return 0;
}
