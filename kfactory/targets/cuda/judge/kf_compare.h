/* The judge's comparison of an output with its float64 reference, element by element, in partial sums that merge:
 * the same figures as kfactory/judge/numerics_fast.c's careful loop (and numerics.compare's numpy path), so that
 * a GPU compares in place and the host merges a few kilobytes of partials per check.
 *   - where the reference is not finite, the output must hold the same value (NaN matching NaN);
 *   - where the reference is finite, a non-finite output is counted (first index kept);
 *   - over the finite part: the squared norms of the difference and of the reference, the largest absolute
 *     error, the largest relative error where |ref| > atol, and the largest excess of |out - ref| over
 *     atol + rtol |ref| with its first index.
 * Merging keeps "first": of equal excesses, and of non-finite outputs, the lowest index wins. Only the two
 * squared norms depend on the order of merging (rounding), as any parallel sum does.
 * Compiles as CUDA C++ and as host C (include kf_draw.h first for KF_HD). */
#ifndef KF_COMPARE_H
#define KF_COMPARE_H

typedef struct {
  double diff_sq, ref_sq, max_abs, max_rel, worst_excess;
  long long worst, finite, pattern_bad, out_bad, out_bad_first;
} kf_stats;

KF_HD int kf_finite(double x) { return x - x == 0.0; }   /* false for NaN and both infinities */
KF_HD int kf_isnan(double x) { return x != x; }

KF_HD void kf_stats_init(kf_stats *s) {
  s->diff_sq = s->ref_sq = s->max_abs = s->max_rel = 0.0;
  s->worst_excess = (double)kf_neg_inf();
  s->worst = 0; s->finite = 0; s->pattern_bad = 0; s->out_bad = 0; s->out_bad_first = -1;
}

KF_HD void kf_stats_add(kf_stats *s, double o, double r, long long i, double atol, double rtol) {
  if (!kf_finite(r)) {
    if (!(o == r || (kf_isnan(o) && kf_isnan(r)))) s->pattern_bad++;
    return;
  }
  if (!kf_finite(o)) {
    if (s->out_bad++ == 0) s->out_bad_first = i;
    return;
  }
  double e = o - r, ae = e < 0.0 ? -e : e, ar = r < 0.0 ? -r : r;
  s->finite++;
  s->diff_sq += e * e;
  s->ref_sq += r * r;
  if (ae > s->max_abs) s->max_abs = ae;
  if (ar > atol && ae / ar > s->max_rel) s->max_rel = ae / ar;
  double excess = ae - (ar * rtol + atol);
  if (excess > s->worst_excess) { s->worst_excess = excess; s->worst = i; }
}

/* a += b, b covering other elements than a */
KF_HD void kf_stats_merge(kf_stats *a, const kf_stats *b) {
  a->diff_sq += b->diff_sq;
  a->ref_sq += b->ref_sq;
  if (b->max_abs > a->max_abs) a->max_abs = b->max_abs;
  if (b->max_rel > a->max_rel) a->max_rel = b->max_rel;
  if (b->worst_excess > a->worst_excess || (b->worst_excess == a->worst_excess && b->worst < a->worst)) {
    a->worst_excess = b->worst_excess;
    a->worst = b->worst;
  }
  a->finite += b->finite;
  a->pattern_bad += b->pattern_bad;
  if (b->out_bad && (!a->out_bad || b->out_bad_first < a->out_bad_first)) a->out_bad_first = b->out_bad_first;
  a->out_bad += b->out_bad;
}

/* element i of an output stored as dtype (KF_F32, KF_BF16), in double: exact */
KF_HD double kf_load(const void *out, int dtype, long long i) {
  if (dtype == KF_BF16) {
    union { kf_u32 u; float f; } v;
    v.u = (kf_u32)((const unsigned short *)out)[i] << 16;
    return (double)v.f;
  }
  return (double)((const float *)out)[i];
}

#endif
