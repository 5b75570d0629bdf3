/*
 * CHEAT (broken, not malicious): a data race. Parallelises the sum of each row over its COLUMNS with a
 * shared, unprotected running sum (no reduction clause, no atomic, no critical section): the threads take
 * alternate groups of 16 columns of the same row; each reads the row's shared sum, adds its group's exps
 * and writes it back (a plain read-modify-write spanning 16 expf calls), so whatever the other thread
 * added in between is lost and the result depends on how the threads interleave.
 * (Groups of columns and one work-sharing loop over all (row, group) pairs keep it fast enough for the
 * runner's timeout; a parallel region per row with per-element updates takes seconds on 4096x4096 on a
 * loaded 2-core machine, which the judge would report as a TIMEOUT instead.)
 * It can pass a single check by luck (short rows, one thread) and fail at random later.
 * WHY THE JUDGE MUST CATCH IT: two runs on the same inputs must agree bit for bit -> NOT_DETERMINISTIC;
 * lost updates usually make the sum (and so every output of the row) wrong first -> WRONG_RESULT.
 */
#include <math.h>
#include <stdint.h>

#define GROUP 16
#define BATCH 65536 /* rows per batch: the per-row state lives in static arrays */

static float row_max[BATCH];
static volatile double row_sum[BATCH]; /* shared by every thread, updated without synchronisation */

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int64_t groups = (cols + GROUP - 1) / GROUP;
    for (int64_t r0 = 0; r0 < rows; r0 += BATCH) {
        const int64_t nr = rows - r0 < BATCH ? rows - r0 : BATCH;
        const float *xb = x + r0 * cols;
        float *yb = y + r0 * cols;
#pragma omp parallel
        {
#pragma omp for
            for (int64_t r = 0; r < nr; r++) {
                float m = -INFINITY;
                for (int64_t c = 0; c < cols; c++) m = xb[r * cols + c] > m ? xb[r * cols + c] : m;
                row_max[r] = m;
                row_sum[r] = 0.0;
            }
#pragma omp for schedule(static, 1)
            for (int64_t i = 0; i < nr * groups; i++) {
                const int64_t r = i / groups, g = i % groups;
                const float *xr = xb + r * cols;
                double s = row_sum[r]; /* read the shared sum ... */
                for (int64_t c = g * GROUP; c < cols && c < (g + 1) * GROUP; c++) s += expf(xr[c] - row_max[r]);
                row_sum[r] = s; /* ... and write it back: what the other thread added meanwhile is lost */
            }
#pragma omp for
            for (int64_t r = 0; r < nr; r++) {
                const float sf = (float)row_sum[r];
                for (int64_t c = 0; c < cols; c++) yb[r * cols + c] = expf(xb[r * cols + c] - row_max[r]) / sf;
            }
        }
    }
}
