/* kfactory's counter-based input generator: one verification input element from (seed, tensor, element index)
 * alone, so that a GPU draws a whole input set in place and the judge's host twin (kfactory/judge/counter_rng.py,
 * numpy) reproduces any element, row or set bit for bit from the recorded seed.
 *
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) keyed by the seed maps
 * the counter (element index low, high, tensor index, stream) to four 32-bit words. Stream 0 gives the value,
 * stream 1 the -inf mask's draw, stream 2 (counter = the row) the column a masked row keeps finite.
 *
 * Every step after Philox is IEEE double arithmetic in a fixed order: +, -, *, / and sqrt (correctly rounded on
 * both sides), frexp and floor (exact). The logarithm and cosine of Box-Muller are short polynomials written out
 * here, not a math library's (CUDA's and numpy's differ in the last bits, and a twin must not). Device code must
 * be built with --fmad=false and host code with -ffp-contract=off, so that no a * b + c is fused behind the twin's
 * back.
 *
 * Compiles as CUDA C++ (NVRTC: __CUDACC__) and as host C (the tests build the same file with the system compiler
 * and hold it to the numpy twin). */
#ifndef KF_DRAW_H
#define KF_DRAW_H

#ifdef __CUDACC__
#define KF_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define KF_HD static inline
#endif

typedef unsigned int kf_u32;
typedef unsigned long long kf_u64;

/* distribution kinds (kfactory/judge/counter_rng.py KINDS) and output dtypes (DTYPES) */
#define KF_NORMAL 0
#define KF_UNIFORM 1
#define KF_CONSTANT 2
#define KF_F32 0
#define KF_BF16 1

typedef struct { kf_u32 v[4]; } kf_words;

KF_HD kf_words kf_philox(kf_u32 c0, kf_u32 c1, kf_u32 c2, kf_u32 c3, kf_u64 seed) {
  kf_u32 k0 = (kf_u32)seed, k1 = (kf_u32)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    kf_u64 p0 = (kf_u64)0xD2511F53u * c0, p1 = (kf_u64)0xCD9E8D57u * c2;
    kf_u32 n0 = (kf_u32)(p1 >> 32) ^ c1 ^ k0, n2 = (kf_u32)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = (kf_u32)p1; c2 = n2; c3 = (kf_u32)p0;
  }
  kf_words w = {{c0, c1, c2, c3}};
  return w;
}

/* [0, 1) on the 2^-53 grid from two words: exact */
KF_HD double kf_unit(kf_u32 a, kf_u32 b) {
  return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}

/* c[0] z^(n-1) + ... + c[n-1] by Horner's rule, one multiply and one add a step (counter_rng._horner) */
KF_HD double kf_horner(const double *c, int n, double z) {
  double p = c[0];
  for (int k = 1; k < n; k++) p = p * z + c[k];
  return p;
}

/* log(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m-1)/(m+1),
 * |s| <= 0.1716, by its series through s^23 (truncation below 1e-17 of the result) */
KF_HD double kf_log(double u) {
  const double c[12] = {0.043478260869565216, 0.047619047619047616, 0.05263157894736842, 0.058823529411764705,
                        0.06666666666666667, 0.07692307692307693, 0.09090909090909091, 0.1111111111111111,
                        0.14285714285714285, 0.2, 0.3333333333333333, 1.0};
  int e;
  double m = frexp(u, &e);
  if (m < 0.7071067811865476) { m = m * 2.0; e = e - 1; }
  double s = (m - 1.0) / (m + 1.0);
  return (double)e * 0.6931471805599453 + 2.0 * s * kf_horner(c, 12, s * s);
}

/* cos(a) and sin(a) for a in [0, pi/4] by their Taylor series through a^16 and a^17 */
KF_HD double kf_cos_small(double a2) {
  const double c[9] = {4.779477332387385e-14, -1.1470745597729725e-11, 2.08767569878681e-09, -2.755731922398589e-07,
                       2.48015873015873e-05, -0.001388888888888889, 0.041666666666666664, -0.5, 1.0};
  return kf_horner(c, 9, a2);
}

KF_HD double kf_sin_small(double a, double a2) {
  const double c[9] = {2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10,
                       -2.505210838544172e-08, 2.7557319223985893e-06, -0.0001984126984126984,
                       0.008333333333333333, -0.16666666666666666, 1.0};
  return kf_horner(c, 9, a2) * a;
}

/* cos(2 pi u) for u in [0, 1): quadrant q of 4u, theta = f pi/2 for its fraction f, folded to [0, pi/4] */
KF_HD double kf_cos2pi(double u) {
  double t = u * 4.0, q = floor(t), f = t - q;
  int fold = f > 0.5;
  double g = fold ? 1.0 - f : f, a = g * 1.5707963267948966, a2 = a * a;
  double c = kf_cos_small(a2), s = kf_sin_small(a, a2);
  double cos_t = fold ? s : c, sin_t = fold ? c : s;   /* cos and sin of theta */
  int k = (int)q;
  return k == 0 ? cos_t : k == 1 ? -sin_t : k == 2 ? -cos_t : sin_t;
}

/* one element before the -inf mask, in double */
KF_HD double kf_value(kf_u64 i, kf_u32 tensor, kf_u64 seed, int kind, double a, double b) {
  if (kind == KF_CONSTANT) return a;
  kf_words w = kf_philox((kf_u32)i, (kf_u32)(i >> 32), tensor, 0u, seed);
  if (kind == KF_UNIFORM) return a + (b - a) * kf_unit(w.v[0], w.v[1]);
  double u1 = 1.0 - kf_unit(w.v[0], w.v[1]), u2 = kf_unit(w.v[2], w.v[3]);   /* u1 in (0, 1] */
  return a + b * (sqrt(-2.0 * kf_log(u1)) * kf_cos2pi(u2));                   /* Box-Muller */
}

/* whether element i (column col of its row) is masked to -inf: a fraction of each row, one column kept finite */
KF_HD int kf_masked(kf_u64 i, kf_u64 row, kf_u64 col, kf_u64 cols, kf_u32 tensor, kf_u64 seed, double fraction) {
  if (fraction <= 0.0) return 0;
  kf_words keep = kf_philox((kf_u32)row, (kf_u32)(row >> 32), tensor, 2u, seed);
  if (col == (kf_u64)keep.v[0] % cols) return 0;
  kf_words w = kf_philox((kf_u32)i, (kf_u32)(i >> 32), tensor, 1u, seed);
  return kf_unit(w.v[0], w.v[1]) < fraction;
}

KF_HD float kf_neg_inf(void) {
  union { kf_u32 u; float f; } v;
  v.u = 0xFF800000u;
  return v.f;
}

/* float32 to bfloat16 bits, rounded to nearest even (finite values and infinities) */
KF_HD unsigned short kf_bf16(float x) {
  union { float f; kf_u32 u; } v;
  v.f = x;
  return (unsigned short)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* element i of an input tensor whose last axis has `cols` elements, stored as `dtype` */
KF_HD void kf_draw_one(void *out, int dtype, kf_u64 i, kf_u64 cols, kf_u64 seed, kf_u32 tensor, int kind,
                       double a, double b, double neg_inf) {
  float x = (float)kf_value(i, tensor, seed, kind, a, b);
  if (kf_masked(i, i / cols, i % cols, cols, tensor, seed, neg_inf)) x = kf_neg_inf();
  if (dtype == KF_BF16) ((unsigned short *)out)[i] = kf_bf16(x);
  else ((float *)out)[i] = x;
}

#endif
