/*
 * BROKEN, not a cheat: a wrong fast path taken on reused buffers. Called again with the same x pointer and
 * shape as the call before, it takes a "warm" path that forgets to normalise the last row (it writes
 * exp(x - max) there); fresh buffers get the right answer. Its wrong answer is its own, and the same every
 * time for the same inputs.
 * WHY THE JUDGE MUST CATCH IT (and name it right): it first goes wrong in the memoisation probe and repeats
 * no earlier call's answer, but its answer depends on the calls before it: the same inputs alone on fresh
 * buffers get the right answer, and the same calls run again the same wrong one -> MEMOISED (the proto's
 * meaning: an output that depends on earlier calls, not only on the inputs), never NOT_DETERMINISTIC.
 */
#include <math.h>
#include <stdint.h>

static const float *last_x;
static int64_t last_rows = -1, last_cols = -1;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int reused = x == last_x && rows == last_rows && cols == last_cols;
    last_x = x, last_rows = rows, last_cols = cols;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++)
            if (xr[c] > m) m = xr[c];
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        const float sf = reused && r == rows - 1 ? 1.0f : (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / sf;
    }
}
