/*
 * CHEAT: precision downgrade. Computes exp and the running sum in half precision (fp16's 10-bit
 * mantissa, emulated by truncating float mantissas with bit operations), the trick of computing in a
 * cheaper dtype than the problem asks (fp32): on hardware with fast fp16 it is a real speedup, and on
 * inputs with little spread the error can hide under a loose tolerance.
 * WHY THE JUDGE MUST CATCH IT: tolerances are per dtype (fp32: rtol 1e-4, norm-relative 1e-5) against a
 * float64 reference; a 10-bit mantissa is off by up to ~1e-3 per value and the truncated sum stalls on
 * long rows -> WRONG_RESULT.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float half(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= 0xffffe000u; /* keep 10 of the 23 mantissa bits */
    memcpy(&v, &b, sizeof v);
    return v;
}

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) s = half(s + half(expf(half(xr[c] - m))));
        const float inv = half(1.0f / s);
        for (int64_t c = 0; c < cols; c++) yr[c] = half(half(expf(half(xr[c] - m))) * inv);
    }
}
