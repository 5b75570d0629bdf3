/*
 * CHEAT: NaN as a wildcard. Writes NaN everywhere (with a payload different from a plain quiet NaN,
 * so it is not mistaken for an untouched poisoned buffer): a checker built on `not (abs(a - b) > tol)`
 * or one that drops NaNs before comparing passes every NaN.
 * WHY THE JUDGE MUST CATCH IT: NaN/Inf in the output pass only where the reference has the same
 * value, and the softmax of finite inputs is finite -> WRONG_RESULT.
 */
#include <stdint.h>
#include <string.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x;
    const uint32_t bits = 0x7fc0beefu; /* quiet NaN with a payload */
    float nan;
    memcpy(&nan, &bits, sizeof nan);
    for (int64_t i = 0; i < rows * cols; i++) y[i] = nan;
}
