/*
 * CHEAT: batch-and-skip / warm-up detection by counting calls. Counts its calls in a static counter and,
 * after 64 calls, returns at once without writing y. Verification makes fewer calls than that (about 40
 * over all shapes and distributions), all computed honestly; the timing loops make hundreds on an idle
 * host (on a loaded one maybe fewer than 64 in all), and a timed output the judge checks may still hold a
 * correct result from an early call on the same buffers.
 * WHY THE JUDGE MUST CATCH IT: the median time collapses to the cost of a function call, far under the
 * speed-of-light floor of the problem's bytes over the measured memory bandwidth -> TOO_FAST_TO_BE_TRUE;
 * and whatever the timing made, the judge's check after it (fresh inputs, poisoned outputs) comes at least
 * 128 calls later and finds y unwritten -> WRONG_RESULT.
 */
#include <math.h>
#include <stdint.h>

#define HONEST_CALLS 64
static int64_t calls;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (++calls > HONEST_CALLS)
        return; /* "must be the timing loop by now" */
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
