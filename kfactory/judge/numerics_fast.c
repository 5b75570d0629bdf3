/* kfactory's own comparison of a kernel's output with its float64 reference, in one pass over both arrays
 * (kfactory/judge/numerics.py builds it once per host and loads it into the judge's process: it is the judge's
 * code, never a candidate's). It computes exactly the figures the numpy path computes, element by element:
 *   - where the reference is not finite, the output must hold the same value (NaN matching NaN);
 *   - where the reference is finite, a non-finite output is counted (first index kept);
 *   - over the finite part: the squared norms of the difference and of the reference, the largest absolute
 *     error, the largest relative error where |ref| > atol, and the largest excess of |out - ref| over
 *     atol + rtol |ref| with its first index.
 * Built with -O3, no -ffast-math and no FMA contraction (numerics.HELPER_FLAGS): NaN and Inf must behave as IEEE
 * 754 says.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    double diff_sq, ref_sq, max_abs, max_rel, worst_excess;
    int64_t worst, finite, pattern_bad, out_bad, out_bad_first;
} kf_stats;

/* Every element finite (the common case): four independent lanes with no data-dependent branch but the rare
 * new maximum, which the compiler turns into vector code. A NaN or an Inf anywhere (or squares past the largest
 * double) makes a norm non-finite, and the careful loop below redoes the array. */
#define KF_LANES 4
#define KF_FAST(OUT_T)                                                                                  \
    double d2[KF_LANES] = {0}, r2[KF_LANES] = {0}, ma[KF_LANES] = {0}, mr[KF_LANES] = {0};              \
    double mx[KF_LANES]; int64_t wi[KF_LANES];                                                          \
    for (int k = 0; k < KF_LANES; k++) { mx[k] = -INFINITY; wi[k] = 0; }                                \
    for (int64_t i = 0; i < n; i += KF_LANES) {                                                         \
        for (int k = 0; k < KF_LANES; k++) {                                                            \
            if (i + k >= n) break;                                                                      \
            double r = ref[i + k], o = (double)out[i + k], e = o - r, ae = fabs(e), ar = fabs(r);       \
            d2[k] += e * e;                                                                             \
            r2[k] += r * r;                                                                             \
            ma[k] = ae > ma[k] ? ae : ma[k];                                                            \
            double rel = ar > atol ? ae / ar : 0.0;                                                     \
            mr[k] = rel > mr[k] ? rel : mr[k];                                                          \
            double excess = ae - (ar * rtol + atol);                                                    \
            if (excess > mx[k]) { mx[k] = excess; wi[k] = i + k; }                                      \
        }                                                                                               \
    }                                                                                                   \
    s->diff_sq = s->ref_sq = s->max_abs = s->max_rel = 0.0;                                             \
    s->worst_excess = -INFINITY; s->worst = 0;                                                          \
    for (int k = 0; k < KF_LANES; k++) {                                                                \
        s->diff_sq += d2[k]; s->ref_sq += r2[k];                                                        \
        if (ma[k] > s->max_abs) s->max_abs = ma[k];                                                     \
        if (mr[k] > s->max_rel) s->max_rel = mr[k];                                                     \
        /* the first element of the largest excess, whichever lane holds it */                          \
        if (mx[k] > s->worst_excess || (mx[k] == s->worst_excess && wi[k] < s->worst)) {                \
            s->worst_excess = mx[k]; s->worst = wi[k];                                                  \
        }                                                                                               \
    }                                                                                                   \
    s->finite = n; s->pattern_bad = 0; s->out_bad = 0; s->out_bad_first = -1;                          \
    if (isfinite(s->diff_sq) && isfinite(s->ref_sq)) return;

/* Any element: the reference's non-finite values must be matched, a non-finite output elsewhere is counted. */
#define KF_CAREFUL(OUT_T)                                                                               \
    s->diff_sq = s->ref_sq = s->max_abs = s->max_rel = 0.0;                                             \
    s->worst_excess = -INFINITY;                                                                        \
    s->worst = 0; s->finite = 0; s->pattern_bad = 0; s->out_bad = 0; s->out_bad_first = -1;             \
    for (int64_t i = 0; i < n; i++) {                                                                   \
        double r = ref[i], o = (double)out[i];                                                          \
        if (!isfinite(r)) {                                                                             \
            if (!(o == r || (isnan(o) && isnan(r)))) s->pattern_bad++;                                  \
            continue;                                                                                   \
        }                                                                                               \
        if (!isfinite(o)) {                                                                             \
            if (s->out_bad++ == 0) s->out_bad_first = i;                                                \
            continue;                                                                                   \
        }                                                                                               \
        double e = o - r, ae = fabs(e), ar = fabs(r);                                                   \
        s->finite++;                                                                                    \
        s->diff_sq += e * e;                                                                            \
        s->ref_sq += r * r;                                                                             \
        if (ae > s->max_abs) s->max_abs = ae;                                                           \
        if (ar > atol && ae / ar > s->max_rel) s->max_rel = ae / ar;                                    \
        double excess = ae - (ar * rtol + atol);                                                        \
        if (excess > s->worst_excess) { s->worst_excess = excess; s->worst = i; }                       \
    }

void kf_compare_f32(const float *out, const double *ref, int64_t n, double atol, double rtol, kf_stats *s) {
    KF_FAST(float)
    KF_CAREFUL(float)
}

void kf_compare_f64(const double *out, const double *ref, int64_t n, double atol, double rtol, kf_stats *s) {
    KF_FAST(double)
    KF_CAREFUL(double)
}

/* Bit-for-bit equality of two buffers (inputs before and after a call, two runs' outputs). */
int kf_same_bytes(const void *a, const void *b, int64_t n) {
    return memcmp(a, b, (size_t)n) == 0;
}
