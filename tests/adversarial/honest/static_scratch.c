/*
 * HONEST, with state: a static scratch buffer (one slice per OpenMP thread, set up once and reused by
 * every call) holds exp(x - max) between the sum and the normalisation so exp is computed once per
 * element. Nothing is remembered across calls: every call recomputes every output from its own x.
 * It must PASS: keeping a scratch buffer across calls is legitimate; only reusing RESULTS is memoising,
 * and a check for memoisation must not fire on this kernel.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define MAX_THREADS 64
#define SCRATCH_COLS 65536
static float scratch[MAX_THREADS][SCRATCH_COLS];

static void row_direct(const float *xr, float *yr, int64_t cols, float m) {
    double s = 0.0;
    for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
    const float sf = (float)s;
    for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / sf;
}

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        const int t = omp_get_thread_num();
        if (t >= MAX_THREADS || cols > SCRATCH_COLS) { /* no slice for it: compute without scratch */
            row_direct(xr, yr, cols, m);
            continue;
        }
        float *e = scratch[t];
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            e[c] = expf(xr[c] - m);
            s += e[c];
        }
        const float sf = (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = e[c] / sf;
    }
}
