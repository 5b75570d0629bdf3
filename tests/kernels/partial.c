#include <math.h>
#include <stdint.h>
/* Skips the last element of every row: the poisoned output gives it away. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        for (int64_t c = 0; c + 1 < cols; c++) yr[c] = expf(xr[c] - m) / s;
    }
}
