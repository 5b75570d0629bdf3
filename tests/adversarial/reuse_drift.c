/*
 * BROKEN, not a cheat: state that leaks between calls. Called again with the same x pointer and shape as
 * the call before, it adds a drift that grows with every call (as a race or an uninitialised accumulator
 * would: the answer depends on what ran before, not on the inputs), so no two such calls agree. Fresh
 * buffers always get the right answer, and it never repeats an earlier call's answer.
 * WHY THE JUDGE MUST CATCH IT (and name it right): it first goes wrong in the memoisation probe (the only
 * place that calls it twice on the same buffers with different values), but it is not memoising: the same
 * calls run again give a different answer -> NOT_DETERMINISTIC, never MEMOISED.
 */
#include <math.h>
#include <stdint.h>

static const float *last_x;
static int64_t last_rows = -1, last_cols = -1, calls;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int reused = x == last_x && rows == last_rows && cols == last_cols;
    const float drift = reused ? 1e-3f * (float)(++calls) : 0.0f;
    last_x = x, last_rows = rows, last_cols = cols;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++)
            if (xr[c] > m) m = xr[c];
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        const float sf = (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / sf + drift;
    }
}
