/*
 * CHEAT: input mutation. Casts away const and subtracts the row maximum from x in place (saving a
 * subtraction per element in the later passes and using the input as scratch). The output is correct,
 * but the caller's x is destroyed: a harness that computes its reference after the candidate, or reuses
 * the input for the next kernel, is silently fed different data.
 * WHY THE JUDGE MUST CATCH IT: inputs are compared bit for bit before and after every call
 * -> INPUT_MUTATED.
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    float *xw = (float *)x; /* const cast away */
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        float *xr = xw + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) xr[c] -= m; /* written back into the input */
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c]);
        const float sf = (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c]) / sf;
    }
}
