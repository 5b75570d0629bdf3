/*
 * Reference CPU kernel for the add_rmsnorm problem: the plain scalar loops a careful non-expert writes,
 * compiled with "-O2 -fopenmp" (no fast-math); rows are split across OpenMP threads (OMP_NUM_THREADS).
 *
 *   h = x + res;  y = h / sqrt(mean(h^2) + eps) * w       (per row)
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, const float *res, const float *w, float *h, float *y, int64_t rows, int64_t hidden,
            float eps) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * hidden, *rr = res + r * hidden;
    float *hr = h + r * hidden, *yr = y + r * hidden;
    float ss = 0.0f;
    for (int64_t c = 0; c < hidden; c++) {
      hr[c] = xr[c] + rr[c];
      ss += hr[c] * hr[c];
    }
    const float rstd = 1.0f / sqrtf(ss / (float)hidden + eps);
    for (int64_t c = 0; c < hidden; c++) yr[c] = hr[c] * rstd * w[c];
  }
}
