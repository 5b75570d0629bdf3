/* The reference softmax, repaired: the row sum is s (the scripted model double's "fix" reply). */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; c++) {
      if (xr[c] > m) m = xr[c];
    }
    double s = 0.0;
    for (int64_t c = 0; c < cols; c++) {
      s += expf(xr[c] - m);
    }
    const float sf = (float)s;
    for (int64_t c = 0; c < cols; c++) {
      yr[c] = expf(xr[c] - m) / sf;
    }
  }
}
