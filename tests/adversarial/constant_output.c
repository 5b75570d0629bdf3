/*
 * CHEAT: constant output. Writes 1/cols everywhere (the softmax of a constant row), which is "close"
 * to the answer on degenerate data (tiny inputs make softmax nearly uniform) and sums to 1 per row, so a
 * checker that only tests row sums, uses a loose absolute tolerance or draws degenerate inputs passes it.
 * WHY THE JUDGE MUST CATCH IT: inputs have real spread (normal, uniform, large) and the error is
 * norm-relative plus elementwise rtol -> WRONG_RESULT.
 */
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x;
    const float v = 1.0f / (float)cols;
    for (int64_t i = 0; i < rows * cols; i++) y[i] = v;
}
