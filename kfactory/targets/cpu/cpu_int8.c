/* Peak int8 dot-product probe for the roofline of integer kernels (an engine's `q4_decode: vnni` matvec): per
 * thread, 12 independent chains of vpdpbusd (unsigned byte x signed byte products, four summed into each 32-bit
 * lane) one register wide, no memory traffic. Twelve chains cover the instruction's latency (4-5 cycles) at up to
 * two issues a cycle. AVX512-VNNI takes 64-byte registers (64 products an instruction), AVX-VNNI 32-byte ones
 * (32); without either the host has no such instruction and the probe reports 0 products (the caller then
 * reports no peak). y[0] receives a sum so the loop cannot be removed; y[1] the number of threads that ran;
 * y[2] the byte products per instruction, which the caller's count needs. */
#include <stdint.h>
#include <omp.h>

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define PRODUCTS 64
typedef __m512i reg;
#define SET1(v) _mm512_set1_epi32(v)
#define DOT(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
static int32_t lanes_sum(reg v) { return _mm512_reduce_add_epi32(v); }
#elif defined(__AVXVNNI__)
#include <immintrin.h>
#define PRODUCTS 32
typedef __m256i reg;
#define SET1(v) _mm256_set1_epi32(v)
#define DOT(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
static int32_t lanes_sum(reg v) {
  int32_t out[8], s = 0;
  _mm256_storeu_si256((__m256i *)out, v);
  for (int l = 0; l < 8; l++) s += out[l];
  return s;
}
#else
#define PRODUCTS 0
#endif

void kernel(const float *x, float *y, int64_t n) {
  (void)x; (void)n; /* unused where the host has no dot-product instruction */
  float total = 0.0f;
  int nthreads = 1;
#pragma omp parallel reduction(+ : total)
  {
#if PRODUCTS
    /* operands from the input, so the compiler cannot fold the chains into constants; each chain its own start,
       so that common subexpressions do not merge them */
    int32_t seed = (int32_t)(x[1] * 10.0f) * 0x01010101;
    reg a = SET1((int32_t)(x[0] * 10.0f) * 0x01010101);
    reg c0 = SET1(seed), c1 = SET1(seed + 1), c2 = SET1(seed + 2), c3 = SET1(seed + 3), c4 = SET1(seed + 4);
    reg c5 = SET1(seed + 5), c6 = SET1(seed + 6), c7 = SET1(seed + 7), c8 = SET1(seed + 8);
    reg c9 = SET1(seed + 9), c10 = SET1(seed + 10), c11 = SET1(seed + 11);
    /* each chain's signed operand is its own sum: with a loop-invariant one GCC folds a chain's n products into
       one multiplication and the probe times nothing (and the cpu target's rules refuse inline asm barriers) */
    for (int64_t i = 0; i < n; i++) {
      c0 = DOT(c0, a, c0); c1 = DOT(c1, a, c1); c2 = DOT(c2, a, c2); c3 = DOT(c3, a, c3);
      c4 = DOT(c4, a, c4); c5 = DOT(c5, a, c5); c6 = DOT(c6, a, c6); c7 = DOT(c7, a, c7);
      c8 = DOT(c8, a, c8); c9 = DOT(c9, a, c9); c10 = DOT(c10, a, c10); c11 = DOT(c11, a, c11);
    }
    /* int32 lanes wrap on overflow (vpdpbusd does not saturate); the sum only keeps the loop alive */
    total += (float)lanes_sum(c0) + (float)lanes_sum(c1) + (float)lanes_sum(c2) + (float)lanes_sum(c3)
             + (float)lanes_sum(c4) + (float)lanes_sum(c5) + (float)lanes_sum(c6) + (float)lanes_sum(c7)
             + (float)lanes_sum(c8) + (float)lanes_sum(c9) + (float)lanes_sum(c10) + (float)lanes_sum(c11);
#endif
#pragma omp single
    nthreads = omp_get_num_threads();
  }
  y[0] = total;
  y[1] = (float)nthreads;
  y[2] = (float)PRODUCTS;
}
