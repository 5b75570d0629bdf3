/*
 * Reference CPU kernel for the rope problem: the engine's scalar rotation (kfactory/engines/c/forward.c rope)
 * over every token, compiled with "-O2 -fopenmp" (no fast-math); tokens are split across OpenMP threads.
 *
 *   out[2i] = x[2i] cos_i - x[2i+1] sin_i,   out[2i+1] = x[2i] sin_i + x[2i+1] cos_i   (per head)
 */
#include <stdint.h>

static void rotate(const float *x, float *out, int64_t heads, int64_t P, const float *c, const float *s) {
  for (int64_t h = 0; h < heads; h++, x += 2 * P, out += 2 * P)
    for (int64_t i = 0; i < P; i++) {
      const float x0 = x[2 * i], x1 = x[2 * i + 1];
      out[2 * i] = x0 * c[i] - x1 * s[i];
      out[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
}

void kernel(const float *q, const float *k, const float *rcos, const float *rsin, float *qr, float *kr, int64_t T,
            int64_t H, int64_t KV, int64_t P) {
#pragma omp parallel for
  for (int64_t t = 0; t < T; t++) {
    const float *c = rcos + t * P, *s = rsin + t * P;
    rotate(q + t * H * 2 * P, qr + t * H * 2 * P, H, P, c, s);
    rotate(k + t * KV * 2 * P, kr + t * KV * 2 * P, KV, P, c, s);
  }
}
