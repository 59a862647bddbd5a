/* A layer generating tokens from its KV cache, in plain C11: Dm = 512,
 * H = 8 (GQA: 2 kv heads), L = 64, RoPE, causal.  A 256-token prompt is
 * prefilled in one call, then each new token is one call with seq = 1 that
 * appends its K and V to the cache and attends over everything before it.
 * There is no model around the layer, so the "next token" fed back is the
 * layer's output, RMS-normalized.  Prints tokens/s.
 *
 *   decode_layer [tokens to generate (default 128)] [cache dtype: f32|f16|bf16] */
#include <headsum/headsum.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float* random_floats(size_t n, unsigned* state, float scale) {
  float* x = malloc(n * sizeof(float));
  if (x == NULL) exit(1);
  for (size_t i = 0; i < n; ++i) {
    *state = *state * 1664525u + 1013904223u;
    x[i] = scale * ((float)(*state >> 8) / 8388608.0f - 1.0f);
  }
  return x;
}

static int check(headsum_status status, const char* what) {
  if (status == HEADSUM_OK) return 0;
  fprintf(stderr, "%s failed: %s\n", what, headsum_last_error());
  return 1;
}

/* x <- y / rms(y): the next input token. */
static void rms_normalize(const float* y, float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (double)y[i] * y[i];
  const float inv = (float)(1.0 / sqrt(sum / (double)n + 1e-6));
  for (int64_t i = 0; i < n; ++i) x[i] = y[i] * inv;
}

int main(int argc, char** argv) {
  const int64_t Dm = 512, H = 8, Hkv = 2, L = 64, prompt = 256;
  const int64_t generate = argc > 1 ? atoll(argv[1]) : 128;
  headsum_dtype cache_dtype = HEADSUM_F32;
  if (argc > 2 && strcmp(argv[2], "f16") == 0) cache_dtype = HEADSUM_F16;
  if (argc > 2 && strcmp(argv[2], "bf16") == 0) cache_dtype = HEADSUM_BF16;
  if (generate < 1) return 1;

  unsigned state = 7;
  const float w_scale = 1.0f / sqrtf((float)Dm);
  float* wq = random_floats((size_t)(Dm * H * L), &state, w_scale);
  float* wk = random_floats((size_t)(Dm * Hkv * L), &state, w_scale);
  float* wv = random_floats((size_t)(Dm * Hkv * L), &state, w_scale);
  float* wo = random_floats((size_t)(H * L * Dm), &state, 1.0f / sqrtf((float)(H * L)));
  float* x = random_floats((size_t)(prompt * Dm), &state, 1.0f);
  float* y = malloc((size_t)(prompt * Dm) * sizeof(float));
  if (y == NULL) return 1;

  const headsum_mha_config config = {Dm, H, Hkv, L, 1, 10000.0f, HEADSUM_F32, cache_dtype};
  headsum_mha* mha = NULL;
  headsum_kv_cache* cache = NULL;
  if (check(headsum_mha_create(&config, wq, wk, wv, wo, NULL, NULL, NULL, NULL, &mha),
            "headsum_mha_create") ||
      check(headsum_kv_cache_create(mha, 1, prompt + generate, &cache),
            "headsum_kv_cache_create")) {
    return 1;
  }
  /* The weights are packed inside the layer: ours can go. */
  free(wq), free(wk), free(wv), free(wo);

  double t0 = now_seconds();
  if (check(headsum_mha_forward(mha, cache, 1, prompt, x, y), "prefill")) return 1;
  const double prefill_s = now_seconds() - t0;

  float* token = x; /* reuse: one row */
  rms_normalize(y + (prompt - 1) * Dm, token, Dm);
  t0 = now_seconds();
  for (int64_t t = 0; t < generate; ++t) {
    if (check(headsum_mha_forward(mha, cache, 1, 1, token, y), "decode step")) return 1;
    rms_normalize(y, token, Dm);
  }
  const double decode_s = now_seconds() - t0;

  printf("target %s, cache %s: prefill %lld tokens in %.2f ms; %lld tokens generated at "
         "%.0f tokens/s (%.1f us/token); cache holds %lld\n",
         headsum_active_target(),
         cache_dtype == HEADSUM_F32 ? "f32" : cache_dtype == HEADSUM_F16 ? "f16" : "bf16",
         (long long)prompt, 1e3 * prefill_s, (long long)generate,
         (double)generate / decode_s, 1e6 * decode_s / (double)generate,
         (long long)headsum_kv_cache_length(cache));
  headsum_kv_cache_free(cache);
  headsum_mha_free(mha);
  free(x), free(y);
  return 0;
}
