/*
 * Reference CPU kernel for the decode_attention_gqa problem: the engine's scalar attention step
 * (kfactory/engines/c/forward.c attend) as a careful non-expert writes it, compiled with "-O2 -fopenmp" (no
 * fast-math); query heads are split across OpenMP threads.
 *
 *   per query head h (kv head h / (H / KV)): s_p = q . K[p] / sqrt(D); o = sum_p exp(s_p - max s) V[p] / sum
 *
 * The scores live in a stack array of ctx floats (4 KiB at ctx 1024).
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *q, const float *k, const float *v, float *o, int64_t H, int64_t KV, int64_t ctx,
            int64_t D) {
  const int64_t group = H / KV;
  const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for
  for (int64_t h = 0; h < H; h++) {
    const float *qh = q + h * D;
    const float *kh = k + (h / group) * ctx * D, *vh = v + (h / group) * ctx * D;
    float *oh = o + h * D;
    float s[ctx];
    float mx = -INFINITY;
    for (int64_t p = 0; p < ctx; p++) {
      float dot = 0.0f;
      for (int64_t d = 0; d < D; d++) dot += qh[d] * kh[p * D + d];
      s[p] = dot * scale;
      if (s[p] > mx) mx = s[p];
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < ctx; p++) {
      s[p] = expf(s[p] - mx);
      sum += s[p];
    }
    for (int64_t d = 0; d < D; d++) oh[d] = 0.0f;
    for (int64_t p = 0; p < ctx; p++)
      for (int64_t d = 0; d < D; d++) oh[d] += s[p] * vh[p * D + d];
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; d++) oh[d] *= inv;
  }
}
