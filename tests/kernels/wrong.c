#include <math.h>
#include <stdint.h>
/* Forgets to normalise: exp(x - max) instead of softmax. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m);
    }
}
