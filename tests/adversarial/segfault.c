/*
 * CHEAT (broken): writes through a null pointer, so the runner dies of SIGSEGV mid-call.
 * WHY THE JUDGE MUST CATCH IT: a candidate's crash must be a typed result for that candidate, never an
 * exception that takes the service down; the runner is replaced -> CRASHED.
 */
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile float *p = (volatile float *)0;
    (void)x;
    (void)rows;
    (void)cols;
    *p = y[0];
}
