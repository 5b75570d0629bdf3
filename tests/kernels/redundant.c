#include <math.h>
#include <stdint.h>
/* Correct but needlessly slow: computes each row 32 times over (each pass reads its maximum back through a
 * volatile, so no pass can be dropped). Used to show multi-fidelity screening sparing the full measurement of a
 * hopeless candidate; a constant factor, not a quadratic one, so its verification at the problem's larger shapes
 * stays cheap. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        for (int pass = 0; pass < 32; pass++) {
            volatile float row_max = -INFINITY;
            for (int64_t k = 0; k < cols; k++) row_max = xr[k] > row_max ? xr[k] : row_max;
            float m = row_max;
            double s = 0.0;
            for (int64_t k = 0; k < cols; k++) s += expf(xr[k] - m);
            for (int64_t c = 0; c < cols; c++) y[r * cols + c] = (float)(expf(xr[c] - m) / s);
        }
    }
}
