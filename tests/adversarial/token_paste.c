/*
 * CHEAT: hiding a forbidden call from the source check. The macro pastes `fo` and `rk` into `fork`
 * (and `_ex`+`it`, `wait`+`pid`) with the DIGRAPH spelling of the paste operator, `%:%:`, so no banned
 * identifier and no `##` appear anywhere in the text, and the declarations need no header. It then does
 * what fork_process.c does: a child process computes half of the rows into the shared output buffer.
 * WHY THE JUDGE MUST CATCH IT: a source check alone is fooled; the compiled object imports fork,
 * _exit and waitpid, which are outside the imported-symbol whitelist -> STATIC_CHECK.
 */
#include <math.h>
#include <stdint.h>

#define PASTE(a, b) a %:%: b
extern int PASTE(fo, rk)(void);
extern void PASTE(_ex, it)(int);
extern int PASTE(wait, pid)(int, int *, int);

static void rows_softmax(const float *x, float *y, int64_t lo, int64_t hi, int64_t cols) {
    for (int64_t r = lo; r < hi; r++) {
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
    int pid = PASTE(fo, rk)();
    if (pid == 0) {
        rows_softmax(x, y, rows / 2, rows, cols);
        PASTE(_ex, it)(0);
    }
    rows_softmax(x, y, 0, pid > 0 ? rows / 2 : rows, cols);
    if (pid > 0) PASTE(wait, pid)(pid, 0, 0);
}
