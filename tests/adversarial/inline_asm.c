/*
 * CHEAT: inline assembly. An empty asm statement with a "memory" clobber here, but asm can issue any
 * instruction, including a raw `syscall`, with no libc symbol for the import check to see.
 * WHY THE JUDGE MUST CATCH IT: inline assembly is refused by the source check -> STATIC_CHECK.
 */
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    __asm__ __volatile__("" : : : "memory");
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
