/*
 * CHEAT: batch-and-skip / warm-up detection by counting calls. Counts its calls per (rows, cols) in a
 * static table and, after 64 calls with a shape, returns at once without writing y. Verification makes
 * a handful of calls per shape, all computed honestly; the timing loop makes hundreds, and the few it
 * checks (the first argument set, written during warm-up) still hold a correct result from an early call.
 * (Counted per shape, not globally, so that adding verification calls on other shapes never trips it
 * early: the cheat only ever fires inside a timing loop.)
 * WHY THE JUDGE MUST CATCH IT: the median time collapses to the cost of a function call, far under the
 * speed-of-light floor of the problem's bytes over the measured memory bandwidth -> TOO_FAST_TO_BE_TRUE.
 */
#include <math.h>
#include <stdint.h>

#define SHAPES 64
#define HONEST_CALLS 64
static int64_t shape_rows[SHAPES], shape_cols[SHAPES], calls[SHAPES];
static int n_shapes;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int i = 0;
    while (i < n_shapes && !(shape_rows[i] == rows && shape_cols[i] == cols)) i++;
    if (i == n_shapes && n_shapes < SHAPES) {
        shape_rows[i] = rows;
        shape_cols[i] = cols;
        n_shapes++;
    }
    if (i < SHAPES && ++calls[i] > HONEST_CALLS)
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
