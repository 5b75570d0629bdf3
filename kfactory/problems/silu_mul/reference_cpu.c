/*
 * Reference CPU kernel for the silu_mul problem: the plain scalar loop a careful non-expert writes, compiled
 * with "-O2 -fopenmp" (no fast-math); rows are split across OpenMP threads (OMP_NUM_THREADS).
 *
 *   y[i] = g[i] / (1 + exp(-g[i])) * u[i]
 *
 * For g < -88.7, expf(-g) overflows to inf and g / inf = -0: the right limit (the true value is below 1e-36).
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *g, const float *u, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * cols + c;
      y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
  }
}
