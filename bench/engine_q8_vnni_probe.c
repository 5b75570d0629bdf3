/* Probe for issue 26: the LM head's Q8_0 matvec in integers (vpdpbusd, AVX512-VNNI) against a conversion kernel,
 * before either is part of the engine. On one core it prints both kernels' error against a float64 reference and
 * their rates from cache (one matrix again and again) and streamed (a 512 MB rotation), side by side:
 *
 *     gcc -O3 -march=native bench/engine_q8_vnni_probe.c -o /tmp/q8probe -lm && /tmp/q8probe [ROWS=4096] [BLOCKS=18]
 *
 * The layout it assumes (not yet the engine's): PACK16 for Q8_0, 16 rows interleaved so that 32-bit lane i of a
 * vector is row i: f16 d[16] (32 B), then u8 q[8][16][4] (512 B, each code + 128, so vpdpbusd's unsigned operand
 * holds the weights and the signed one x's digits) = 544 B a block of 16 rows. x is cut into four byte digits per
 * value on its block's power-of-two grid as the engine's vnni_digits does (29 bits), and the digits' sums per block
 * T_k take the +128 back out: sum_j w_j v_j = sum_k 2^(21-7k) (S_k - 128 T_k), S_k = sum_j (w_j + 128) d_kj, exact
 * in 32-bit integers; the two digit pairs meet in one fp32 FMA, rounded once. The conversion kernel is plain rows of
 * GGUF blocks (int8 -> fp32, two FMAs a block), the engine's Q8_0 decode kernel's arithmetic. */
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

/* digits: per block 128 B (A[32] B[32] C[32] D[32]) ; then scales[nb] floats; then T[nb][4] int32 */
static void digits(const float *x, int cols, int8_t *dg, float *sc, int32_t *T) {
  int nb = cols / 32;
  const __m512i top = _mm512_set1_epi32((1 << 28) - 1), bottom = _mm512_set1_epi32(-(1 << 28));
  const __m512i low7 = _mm512_set1_epi32(127);
  for (int b = 0; b < nb; b++) {
    __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    uint32_t bits; memcpy(&bits, &mx, 4);
    int ex = (int)(bits >> 23);
    if (mx == 0.0f) { sc[b] = 0; memset(dg + 128 * b, 0, 128); memset(T + 4 * b, 0, 16); continue; }
    int e = ex - 126 < -98 ? -98 : ex - 126;
    uint32_t inv_bits = (uint32_t)(155 - e) << 23, sc_bits = (uint32_t)(e + 99) << 23;
    float inv, s; memcpy(&inv, &inv_bits, 4); memcpy(&s, &sc_bits, 4);
    sc[b] = s;
    __m512 iv = _mm512_set1_ps(inv);
    __m512i tk[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int h = 0; h < 2; h++) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(h ? v1 : v0, iv));
      q = _mm512_max_epi32(_mm512_min_epi32(q, top), bottom);
      int8_t *o = dg + 128 * b + 16 * h;
      __m512i a = _mm512_srai_epi32(q, 21);
      tk[0] = _mm512_add_epi32(tk[0], a);
      _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(a));
      for (int k = 1; k < 4; k++) {
        __m512i d = _mm512_and_si512(_mm512_srli_epi32(q, 21 - 7 * k), low7);
        tk[k] = _mm512_add_epi32(tk[k], d);
        _mm_storeu_si128((__m128i *)(o + 32 * k), _mm512_cvtepi32_epi8(d));
      }
    }
    for (int k = 0; k < 4; k++) T[4 * b + k] = _mm512_reduce_add_epi32(tk[k]);
  }
}

static inline int32_t ld4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

static void q8group16_vnni(const uint8_t *grp, int nb, const int8_t *dg, const float *sc, const int32_t *T, float *y) {
  __m512 acc = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 544;
    for (int l = 0; l < 544; l += 64) _mm_prefetch((const char *)blk + 4096 + l, _MM_HINT_T0);
    const int8_t *xa = dg + 128 * b, *xb = xa + 32, *xc = xa + 64, *xd = xa + 96;
    __m512i ia = _mm512_setzero_si512(), ib = ia, ic = ia, id = ia;
    for (int c = 0; c < 8; c++) {
      __m512i v = _mm512_loadu_si512((const void *)(blk + 32 + 64 * c));
      ia = _mm512_dpbusd_epi32(ia, v, _mm512_set1_epi32(ld4(xa + 4 * c)));
      ib = _mm512_dpbusd_epi32(ib, v, _mm512_set1_epi32(ld4(xb + 4 * c)));
      ic = _mm512_dpbusd_epi32(ic, v, _mm512_set1_epi32(ld4(xc + 4 * c)));
      id = _mm512_dpbusd_epi32(id, v, _mm512_set1_epi32(ld4(xd + 4 * c)));
    }
    const int32_t *t = T + 4 * b;
    ia = _mm512_sub_epi32(ia, _mm512_set1_epi32(128 * t[0]));
    ib = _mm512_sub_epi32(ib, _mm512_set1_epi32(128 * t[1]));
    ic = _mm512_sub_epi32(ic, _mm512_set1_epi32(128 * t[2]));
    id = _mm512_sub_epi32(id, _mm512_set1_epi32(128 * t[3]));
    __m512 hi2 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ia, 7), ib));
    __m512 lo2 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ic, 7), id));
    __m512 q = _mm512_fmadd_ps(hi2, _mm512_set1_ps(16384.0f), lo2);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    acc = _mm512_fmadd_ps(q, _mm512_mul_ps(d, _mm512_set1_ps(sc[b])), acc);
  }
  _mm512_storeu_ps(y, acc);
}

/* the engine's conversion style for comparison: PACK4-free, plain rows of Q8_0 blocks (34 B), 16 rows at a time */
static void q8rows_convert(const uint8_t *w, int rows, int nb, const float *x, float *y) {
  for (int r = 0; r < rows; r++) {
    const uint8_t *row = w + (size_t)r * nb * 34;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
      const uint8_t *blk = row + 34 * b;
      _mm_prefetch((const char *)blk + 4096, _MM_HINT_T0);
      uint16_t h; memcpy(&h, blk, 2);
      __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
      __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
      __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
      __m512 s = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 32 * b + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(x + 32 * b)));
      acc = _mm512_fmadd_ps(s, d, acc);
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}

int main(int argc, char **argv) {
  int rows = argc > 1 ? atoi(argv[1]) : 4096, nb = argc > 2 ? atoi(argv[2]) : 18, cols = 32 * nb;
  size_t bytes = (size_t)rows / 16 * nb * 544, rbytes = (size_t)rows * nb * 34;
  size_t nmat = (size_t)(512e6 / bytes) + 1;
  uint8_t *pool = aligned_alloc(64, bytes * nmat), *rpool = aligned_alloc(64, rbytes * nmat);
  srand(7);
  for (size_t i = 0; i < bytes * nmat; i++) pool[i] = (uint8_t)rand();
  for (size_t i = 0; i < rbytes * nmat; i++) rpool[i] = (uint8_t)rand();
  /* scales: small halves; the rows layout from the packed one for matrix 0 (same weights) */
  for (size_t g = 0; g < (size_t)rows / 16 * nb * nmat; g++) { uint16_t *h = (uint16_t *)(pool + g * 544); for (int j = 0; j < 16; j++) h[j] = 0x2000 + (uint16_t)(rand() & 0x3ff); }
  for (int r = 0; r < rows; r++) for (int b = 0; b < nb; b++) {
    const uint8_t *blk = pool + ((size_t)(r / 16) * nb + b) * 544;
    uint8_t *o = rpool + ((size_t)r * nb + b) * 34;
    memcpy(o, blk + 2 * (r % 16), 2);
    for (int j = 0; j < 32; j++) o[2 + j] = (uint8_t)((int)blk[32 + 64 * (j / 4) + 4 * (r % 16) + j % 4] - 128);
  }
  for (size_t m = 1; m < nmat; m++) for (size_t i = 0; i < rbytes; i += 34) { uint16_t h = 0x2000; memcpy(rpool + m * rbytes + i, &h, 2); }
  float *x = malloc(4 * cols), *y = aligned_alloc(64, 4 * rows), *yr = malloc(4 * rows), *sc = malloc(4 * nb);
  int8_t *dg = aligned_alloc(64, 128 * nb); int32_t *T = malloc(16 * nb);
  for (int i = 0; i < cols; i++) x[i] = (float)((rand() % 2001) - 1000) / 300.0f;
  /* correctness: float64 reference */
  digits(x, cols, dg, sc, T);
  for (int g = 0; g < rows / 16; g++) q8group16_vnni(pool + (size_t)g * nb * 544, nb, dg, sc, T, y + 16 * g);
  q8rows_convert(rpool, rows, nb, x, yr);
  double err = 0, erc = 0, nrm = 0;
  for (int r = 0; r < rows; r++) {
    double ref = 0;
    for (int b = 0; b < nb; b++) {
      const uint8_t *o = rpool + ((size_t)r * nb + b) * 34; uint16_t h; memcpy(&h, o, 2);
      double s = 0; for (int j = 0; j < 32; j++) s += (double)(int8_t)o[2 + j] * x[32 * b + j];
      ref += s * _cvtsh_ss(h);
    }
    err = fmax(err, fabs(y[r] - ref)); erc = fmax(erc, fabs(yr[r] - ref)); nrm = fmax(nrm, fabs(ref));
  }
  printf("max err vnni %.3g convert %.3g (of max |y| %.3g)\n", err / nrm, erc / nrm, nrm);
  for (int pass = 0; pass < 2; pass++) {
    double bv = 1e30, bc = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      int calls = (int)(1e9 / bytes) + 1;
      double t0 = now();
      for (int c = 0; c < calls; c++) {
        const uint8_t *w = pool + (pass ? (size_t)(c % (int)nmat) * bytes : 0);
        digits(x, cols, dg, sc, T);
        for (int g = 0; g < rows / 16; g++) q8group16_vnni(w + (size_t)g * nb * 544, nb, dg, sc, T, y + 16 * g);
      }
      double per = (now() - t0) / calls; if (per < bv) bv = per;
      t0 = now();
      for (int c = 0; c < calls; c++) q8rows_convert(rpool + (pass ? (size_t)(c % (int)nmat) * rbytes : 0), rows, nb, x, yr);
      per = (now() - t0) / calls; if (per < bc) bc = per;
    }
    printf("%s: vnni %.1f GB/s, convert %.1f GB/s\n", pass ? "streamed" : "cache", bytes / bv / 1e9, rbytes / bc / 1e9);
  }
  return y[0] == 12345.0f;
}
