/*
 * Reference CPU kernel for matvec_f32: the plain loop a careful non-expert
 * writes, rows split across OpenMP threads. Compiled with "-O2 -fopenmp"
 * (no fast-math: the sum stays sequential, so it is not vectorised).
 *
 *   w: rows x cols fp32, row-major; x: cols fp32; y[r] = sum_c w[r, c] x[c]
 */
#include <stdint.h>

void kernel(const float *w, const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; r++) {
    const float *wr = w + r * cols;
    float s = 0.0f;
    for (int64_t c = 0; c < cols; c++) s += wr[c] * x[c];
    y[r] = s;
  }
}
