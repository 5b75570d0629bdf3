/* ---- common.c: the ABI's types, float16, a vector exp, small vector helpers ---------------------------- */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* the calling thread's number in its OpenMP team, and the team's size (0 and 1 outside OpenMP) */
static inline int kf_thread(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
static inline int kf_threads(void) {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

#define KF_ABI_VERSION 1

/* tensor formats and layouts (kf_tensor.format, kf_tensor.layout) */
enum { KF_F32 = 0, KF_Q4_1 = 1, KF_Q8_0 = 2 };
enum { KF_ROWS = 0, KF_PACK4 = 1, KF_PACK16 = 2 };

/* One tensor handed to the engine. ROWS layout: F32 (rows, cols) row-major; Q4_1/Q8_0 each row cols/32 GGUF
 * blocks (20/34 bytes). PACK4 layout: rows padded to a multiple of 4, each group of 4 rows stored block by
 * block: Q4_1 {f16 d[4]; f16 m[4]; u16 q[4][8]} (80 bytes; lane i of a row holds element 8k+i
 * in bits 4k..4k+3), Q8_0 {f16 d[4]; i8 qs[4][32]} (136 bytes),
 * F32 per 8 columns {float v[4][8]}. PACK16 layout (Q4_1 only, design q4_decode "vnni"): rows padded to a multiple
 * of 16, each group of 16 rows stored block by block: {f16 d[16]; f16 m[16]; u8 q[4][16][4]} (320 bytes; byte
 * [c][i][k] holds row i's element 8c+k in its low nibble and 8c+4+k in its high one, so that row i's codes
 * for 4 consecutive elements fill 32-bit lane i). `data` must outlive the engine (it is read, never copied). */
typedef struct {
  const char *name;
  int32_t format;
  int32_t layout;
  int32_t rows;
  int32_t cols;
  const void *data;
} kf_tensor;

/* The architecture the caller believes it hands over: checked against the one compiled in. */
typedef struct {
  int32_t blocks, hidden, heads, kv_heads, head_dim, ffn, vocab;
  float rope_base, rms_eps;
} kf_config;

#define KF_QDIM (KF_HEADS * KF_HEAD_DIM)
#define KF_KVDIM (KF_KV_HEADS * KF_HEAD_DIM)
#define KF_QKV (KF_QDIM + 2 * KF_KVDIM)
#define KF_GROUP (KF_HEADS / KF_KV_HEADS)
#define KF_MAXCOLS (KF_FFN > KF_QDIM ? (KF_FFN > KF_HIDDEN ? KF_FFN : KF_HIDDEN) : (KF_QDIM > KF_HIDDEN ? KF_QDIM : KF_HIDDEN))

static _Thread_local char kf_error[256];

static __attribute__((format(printf, 1, 2))) void set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kf_error, sizeof kf_error, fmt, ap);
  va_end(ap);
}

/* float16 -> float32 (F16C when there, else by its bits: normal, subnormal, inf/nan) */
static inline float f16(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
  if (exp == 0) {
    if (man == 0) { bits = sign; }
    else {  /* subnormal: normalise */
      exp = 113;
      while (!(man & 1024)) { man <<= 1; exp--; }
      bits = sign | (exp << 23) | ((man & 1023) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Sum of x[i]*y[i]: eight independent partial sums (a loop the compiler vectorises without reassociating). */
static inline float dot(const float *x, const float *y, int n) {
  float acc[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += x[i + j] * y[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; i++) s += x[i] * y[i];
  return s;
}

#ifdef __AVX2__
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* expf of 8 lanes (Cephes' polynomial after range reduction by ln2: within 2 ulp of expf over the
 * range softmax and SiLU use; below -87.3 it is 0, as expf underflows there too) */
static inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447504f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}
#endif

/* x[i] = exp(x[i] - shift), returning the sum */
static float exp_shift_sum(float *x, int n, float shift) {
  int i = 0;
  float s = 0.0f;
#ifdef __AVX2__
  __m256 acc = _mm256_setzero_ps(), sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  s = hsum8(acc);
#endif
  for (; i < n; i++) { x[i] = expf(x[i] - shift); s += x[i]; }
  return s;
}

/* g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u (noinline: one machine code for forward() and decode_team) */
static __attribute__((noinline)) void silu_mul(float *g, const float *u, int n) {
  int i = 0;
#ifdef __AVX2__
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(g + i);
    __m256 e = exp8(_mm256_sub_ps(zero, v));
    __m256 s = _mm256_div_ps(v, _mm256_add_ps(one, e));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out = x / sqrt(mean(x^2) + eps) * w; with `add`, x += add first (in the same pass: the fused norm) */
static void rms_norm(float *x, const float *add, const float *w, float eps, float *out, int n) {
  float acc[8] = {0};
  int i = 0;
  if (add) {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) { float v = x[i + j] + add[i + j]; x[i + j] = v; acc[j] += v * v; }
    for (; i < n; i++) { x[i] += add[i]; acc[0] += x[i] * x[i]; }
  } else {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) acc[j] += x[i + j] * x[i + j];
    for (; i < n; i++) acc[0] += x[i] * x[i];
  }
  float ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  float r = 1.0f / sqrtf(ss / (float)n + eps);
  for (i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}
