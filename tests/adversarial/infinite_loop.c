/*
 * CHEAT (broken): never returns. The spin counter is volatile, so the compiler cannot delete the loop
 * (an empty side-effect-free loop may be removed in C11; a volatile access is a side effect).
 * WHY THE JUDGE MUST CATCH IT: a hung candidate must not hang the service; the runner's wall-clock
 * limit ends it and the verdict is typed -> TIMEOUT.
 */
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile uint64_t spin = 0;
    (void)x;
    (void)y;
    (void)rows;
    (void)cols;
    for (;;) spin++;
}
