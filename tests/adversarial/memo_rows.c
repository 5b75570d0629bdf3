/*
 * CHEAT: memoisation of part of the answer. Remembers the first half of the rows of its last output with the
 * x pointer and shape it was computed for; called again on the same x pointer and shape, it copies those rows
 * from memory and computes only the rest, so half its output is always fresh and right. A cache per row (keyed
 * on a row's first values) leaves the same mixture when only some rows change.
 * WHY THE JUDGE MUST CATCH IT: on the same buffers with different values the remembered rows are wrong, and
 * where they are wrong they are an earlier call's answer -> MEMOISED (not a numerical WRONG_RESULT).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CACHE_FLOATS ((int64_t)1 << 24) /* 4096 x 4096 */
static float cache[CACHE_FLOATS];
static const float *cached_x;
static int64_t cached_rows = -1, cached_cols = -1;

static void softmax_rows(const float *x, float *y, int64_t from, int64_t to, int64_t cols) {
#pragma omp parallel for
    for (int64_t r = from; r < to; r++) {
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

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int64_t half = rows / 2, n = rows * cols;
    const int hit = x == cached_x && rows == cached_rows && cols == cached_cols;
    if (hit) memcpy(y, cache, (size_t)(half * cols) * sizeof(float)); /* "these rows were done last time" */
    softmax_rows(x, y, hit ? half : 0, rows, cols);
    if (n <= CACHE_FLOATS) {
        memcpy(cache, y, (size_t)n * sizeof(float));
        cached_x = x, cached_rows = rows, cached_cols = cols;
    }
}
