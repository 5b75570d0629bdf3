#include <math.h>
#include <stdint.h>
/* Correct but needlessly slow: recomputes the row's maximum for every element (cols^2 comparisons per row).
 * Used to show multi-fidelity screening sparing the full measurement of a hopeless candidate. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float row_max = -INFINITY;
        for (int64_t k = 0; k < cols; k++) row_max = xr[k] > row_max ? xr[k] : row_max;
        double s = 0.0;
        for (int64_t k = 0; k < cols; k++) s += expf(xr[k] - row_max);
        for (int64_t c = 0; c < cols; c++) {
            volatile float m = -INFINITY;
            for (int64_t k = 0; k < cols; k++) m = xr[k] > m ? xr[k] : m;
            y[r * cols + c] = (float)(expf(xr[c] - m) / s);
        }
    }
}
