#include <stdint.h>
/* Writes through a null pointer: the runner dies with SIGSEGV. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile float *p = (volatile float *)0;
    (void)x; (void)y; (void)rows; (void)cols;
    *p = 1.0f;
}
