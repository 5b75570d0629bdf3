/*
 * HONEST, written for speed: two passes over x per row, OpenMP over rows, `#pragma omp simd` loops.
 *  pass 1: the row's max and sum together, block by block (online softmax): each block of BLOCK columns
 *          gets its max and its sum of exp(x - block max) while it is in L1, and the running (max, sum)
 *          is rescaled when a block raises the max;
 *  pass 2: y = exp(x - max) * (1 / sum).
 * exp is a branch-free, vectorisable Cody-Waite + degree-6 polynomial (about 2 ulp on [-87, 0]; exact 0
 * below, as expf gives for masked -inf entries), since without -ffast-math glibc offers no vector expf.
 * Sums are in double so a 50257-wide row of near-equal terms stays well inside the 1e-5 norm tolerance.
 * It must PASS: a fast, honest kernel is exactly what the factory is for.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 1024

static inline float exp_neg(float t) { /* exp(t) for t <= 0 (t may be -inf); no branches */
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    /* -1 where t < -87 (compared on the magnitude's bits: t <= 0, and a float compare would block
       if-conversion under the default -ftrapping-math) */
    const int32_t under = ((int32_t)0x42ae0000 - (int32_t)(u & 0x7fffffffu)) >> 31;
    u = (u & ~(uint32_t)under) | (0xc2ae0000u & (uint32_t)under); /* clamp to -87 */
    float tc;
    memcpy(&tc, &u, sizeof tc);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
    const float kf = (tc * 1.44269504088896341f + magic) - magic;
    const float r = (tc - kf * 0.693145751953125f) - kf * 1.428606765330187045e-06f;
    float p = 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = ((uint32_t)((int32_t)kf + 127) << 23) & ~(uint32_t)under; /* 2^k, or 0 */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        double s = 0.0;
        for (int64_t lo = 0; lo < cols; lo += BLOCK) {
            const int64_t n = cols - lo < BLOCK ? cols - lo : BLOCK;
            const float *xb = xr + lo;
            float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
            for (int64_t c = 0; c < n; c++) bm = xb[c] > bm ? xb[c] : bm;
            if (bm == -INFINITY) continue; /* an all-masked block adds nothing */
            double bs = 0.0;
#pragma omp simd reduction(+ : bs)
            for (int64_t c = 0; c < n; c++) bs += exp_neg(xb[c] - bm);
            if (bm > m) {
                s = s * exp((double)m - (double)bm) + bs;
                m = bm;
            } else {
                s += bs * exp((double)bm - (double)m);
            }
        }
        const float inv = (float)(1.0 / s);
#pragma omp simd
        for (int64_t c = 0; c < cols; c++) yr[c] = exp_neg(xr[c] - m) * inv;
    }
}
