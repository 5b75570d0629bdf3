/*
 * CHEAT: stale output. Computes softmax only on the first call for a given (rows, cols); on every
 * later call with a shape it has seen, it returns at once without writing y, betting that the harness
 * hands it the same output buffer again and that the buffer still holds the earlier (correct) result,
 * which is how the Feb 2025 "150x" CUDA kernels "passed" against the reference's own leftover output.
 * WHY THE JUDGE MUST CATCH IT: every output is poisoned before every run, so an unwritten y is all
 * NaN and fails the comparison -> WRONG_RESULT.
 */
#include <math.h>
#include <stdint.h>

#define SEEN_MAX 64
static int64_t seen_rows[SEEN_MAX], seen_cols[SEEN_MAX];
static int n_seen;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int i = 0; i < n_seen; i++)
        if (seen_rows[i] == rows && seen_cols[i] == cols)
            return; /* "the buffer still has it" */
    if (n_seen < SEEN_MAX) {
        seen_rows[n_seen] = rows;
        seen_cols[n_seen] = cols;
        n_seen++;
    }
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
}
