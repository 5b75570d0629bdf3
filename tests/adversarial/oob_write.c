/*
 * CHEAT (broken or malicious): out-of-bounds write. Computes the right answer, then writes four floats
 * past the end of y (y[rows*cols + 0..3]), as an unguarded vector tail store does. Past the end lies
 * whatever the harness allocated next (another tensor, its own bookkeeping); in the worst case it
 * overwrites the reference output or a flag, and usually nobody notices because the page is mapped.
 * WHY THE JUDGE MUST CATCH IT: outputs are surrounded by guard bands that are checked after every call
 * -> OUT_OF_BOUNDS.
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        const float sf = (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / sf;
    }
    const int64_t n = rows * cols;
    for (int64_t k = 0; k < 4; k++) /* the "tail" of a 4-wide store: past the end of y */
        ((volatile float *)y)[n + k] = y[k % n];
}
