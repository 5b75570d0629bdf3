/*
 * Reference CPU kernel for the softmax problem: the straightforward scalar
 * three-pass row softmax a careful non-expert writes. Compiled with
 * "-O2 -fopenmp" (no fast-math); rows are split across OpenMP threads
 * (thread count from OMP_NUM_THREADS).
 *
 *   y[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r)
 *
 * -inf entries (masked positions) give expf(-inf) == 0; a row is never all -inf.
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;

    /* Pass 1: row maximum (for numerical stability). */
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; c++) {
      if (xr[c] > m) m = xr[c];
    }

    /* Pass 2: sum of exp(x - max). The running sum is a double: a float
     * accumulator drifts by up to ~3e-4 (relative) over a 50257-wide row of
     * near-equal terms, beyond the 1e-5 norm tolerance. */
    double s = 0.0;
    for (int64_t c = 0; c < cols; c++) {
      s += expf(xr[c] - m);
    }
    const float sf = (float)s;

    /* Pass 3: normalised output. */
    for (int64_t c = 0; c < cols; c++) {
      yr[c] = expf(xr[c] - m) / sf;
    }
  }
}
