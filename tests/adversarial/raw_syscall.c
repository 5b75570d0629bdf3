/*
 * CHEAT: a raw system call. syscall(SYS_getpid) stands in for any kernel service reached without a
 * named libc wrapper (so a blacklist of wrapper names would miss it): here it seeds a per-process
 * "already computed" decision, the kind of host-state probe a kernel uses to tell a checked run from a
 * timed one.
 * WHY THE JUDGE MUST CATCH IT: <unistd.h> and <sys/syscall.h> are not whitelisted headers and
 * syscall is a banned identifier (and an import outside the whitelist) -> STATIC_CHECK.
 */
#include <math.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

static long last_pid;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    long pid = syscall(SYS_getpid);
    if (pid != last_pid) last_pid = pid;
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
