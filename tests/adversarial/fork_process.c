/*
 * CHEAT: a second process. fork()s a child that computes the second half of the rows straight into y
 * (the harness's output buffer is a shared mapping, so the child's writes land in it) and waits for it.
 * A child process escapes the runner's accounting, can outlive the call, and can do anything the runner
 * can (the same is true of system()).
 * WHY THE JUDGE MUST CATCH IT: no process calls; <unistd.h> and <sys/wait.h> are not whitelisted
 * headers and fork/_exit are banned identifiers -> STATIC_CHECK.
 */
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

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
    pid_t pid = fork();
    if (pid == 0) {
        rows_softmax(x, y, rows / 2, rows, cols);
        _exit(0);
    }
    rows_softmax(x, y, 0, pid > 0 ? rows / 2 : rows, cols);
    if (pid > 0) waitpid(pid, 0, 0);
}
