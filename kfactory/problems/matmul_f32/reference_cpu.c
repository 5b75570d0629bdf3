/*
 * Reference CPU kernel for matmul_f32: the plain triple loop a careful
 * non-expert writes, one dot product per output, tokens x rows split across
 * OpenMP threads. Compiled with "-O2 -fopenmp" (no fast-math: each sum stays
 * sequential, so it is not vectorised).
 *
 *   w: rows x cols fp32, x: n x cols fp32, y: n x rows fp32, all row-major;
 *   y[t, r] = sum_c x[t, c] w[r, c]
 */
#include <stdint.h>

void kernel(const float *w, const float *x, float *y, int64_t n, int64_t rows, int64_t cols) {
#pragma omp parallel for collapse(2)
  for (int64_t t = 0; t < n; t++) {
    for (int64_t r = 0; r < rows; r++) {
      const float *xt = x + t * cols, *wr = w + r * cols;
      float s = 0.0f;
      for (int64_t c = 0; c < cols; c++) s += xt[c] * wr[c];
      y[t * rows + r] = s;
    }
  }
}
