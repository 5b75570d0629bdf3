#include <math.h>
#include <stdint.h>
/* Right only when cols is a multiple of 8: the column loops step by 8 and forget the tail, so the last
 * cols % 8 entries of each row are never read or written. Used to show regression inputs at work. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t body = cols - cols % 8;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < body; c += 8)
            for (int k = 0; k < 8; k++) m = xr[c + k] > m ? xr[c + k] : m;
        for (int64_t c = 0; c < body; c += 8)
            for (int k = 0; k < 8; k++) s += expf(xr[c + k] - m);
        for (int64_t c = 0; c < body; c += 8)
            for (int k = 0; k < 8; k++) yr[c + k] = expf(xr[c + k] - m) / s;
    }
}
