/* Plain C11 against the installed package: one attention layer at the seed
 * shape, checked against the concat-then-GEMM identity on a tiny case. */
#include <headsum/headsum.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  headsum_attn_shape a = {1, 8, 0, 20, 20, 64, 0.0f, 1};
  const size_t n = 1 * 8 * 20 * 64;
  float* q = malloc(n * sizeof(float));
  float* o = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  if (headsum_attention(&a, q, q, q, o) != HEADSUM_OK) {
    fprintf(stderr, "attention failed: %s\n", headsum_last_error());
    return 1;
  }
  /* Row 0 under the causal mask sees key 0 only: O = V[0]. */
  for (int l = 0; l < 64; ++l) {
    if (fabsf(o[l] - q[l]) > 1e-6f) {
      fprintf(stderr, "row 0 mismatch at %d\n", l);
      return 1;
    }
  }
  headsum_attn_shape bad = a;
  bad.kv_heads = 3;
  if (headsum_attention(&bad, q, q, q, o) != HEADSUM_ERR_INVALID_ARGUMENT) return 1;
  printf("C consumer: headsum %s on %s: ok (%s)\n", headsum_version(), headsum_active_target(),
         headsum_last_error());
  free(q);
  free(o);
  return 0;
}
