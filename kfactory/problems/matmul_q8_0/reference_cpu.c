/*
 * Reference CPU kernel for matmul_q8_0: what a careful non-expert writes
 * given a Q8_0 matrix-vector loop: that loop once per token, every block
 * dequantised again for each token, tokens x rows split across OpenMP
 * threads. Compiled with "-O2 -fopenmp" (no fast-math).
 *
 *   w: rows x blocks GGUF Q8_0 blocks of 34 bytes: fp16 d, then 32 int8
 *      codes; element value d * q.
 *   x: n x (32 blocks) fp32; y: n x rows fp32;
 *   y[t, r] = sum over blocks b and elements c of value(r, b, c) * x[t, 32 b + c]
 */
#include <stdint.h>
#include <string.h>

/* IEEE half -> float, subnormals included (no F16C needed). */
static float half_to_float(const uint8_t *p) {
  const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (e == 0) {             /* zero or subnormal: mant * 2^-24, exact in float */
    float v = (float)mant * 5.9604644775390625e-8f;
    memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (e == 31) {     /* inf or NaN */
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (e + 112) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

void kernel(const uint8_t *w, const float *x, float *y, int64_t n, int64_t rows, int64_t blocks) {
#pragma omp parallel for collapse(2)
  for (int64_t t = 0; t < n; t++) {
    for (int64_t r = 0; r < rows; r++) {
      const float *xt = x + t * blocks * 32;
      float s = 0.0f;
      for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = w + (r * blocks + b) * 34;
        const float d = half_to_float(blk);
        const int8_t *q = (const int8_t *)(blk + 2);
        const float *xb = xt + 32 * b;
        for (int j = 0; j < 32; j++) s += d * (float)q[j] * xb[j];
      }
      y[t * rows + r] = s;
    }
  }
}
