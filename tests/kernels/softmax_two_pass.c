/*
 * A two-pass row softmax (one expf per element instead of the reference's two): pass 1 finds the row maximum,
 * pass 2 stores exp(x - max) into y while summing it (blocks of 64 terms in float, blocks added in double),
 * then y is scaled by 1/sum while the row is still in cache. The scripted model double returns it as a
 * "faster kernel" reply.
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    double s = 0.0;
    int64_t c = 0;
    while (c < cols) {
      const int64_t end = cols - c > 64 ? c + 64 : cols;
      float part = 0.0f;
      for (; c < end; c++) {
        const float e = expf(xr[c] - m);
        yr[c] = e;
        part += e;
      }
      s += part;
    }
    const float inv = (float)(1.0 / s);
    for (int64_t k = 0; k < cols; k++) yr[k] *= inv;
  }
}
