/* Peak fp32 arithmetic probe for the cpu target's speed-of-light floor: per thread, 8 independent chains
 * of fused multiply-adds one vector register wide (enough independent work to cover FMA latency on two ports),
 * no memory traffic. The vector is the widest the ISA keeps in registers: 8 chains of a wider type than the
 * registers spill to the stack (64-byte vectors on an AVX2 host measured 1.0 GFLOP/s where 32-byte ones give
 * 19.5). y[0] receives a sum so the loop cannot be removed; y[1] the number of threads that ran; y[2] the
 * lanes per vector, which the caller's flop count needs. */
#include <stdint.h>
#include <omp.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));

void kernel(const float *x, float *y, int64_t n) {
  float total = 0.0f;
  int nthreads = 1;
#pragma omp parallel reduction(+ : total)
  {
    vec a0, a1, a2, a3, a4, a5, a6, a7, b, c;
    for (int l = 0; l < LANES; l++) {
      a0[l] = x[0]; a1[l] = x[1]; a2[l] = x[2]; a3[l] = x[3];
      a4[l] = x[4]; a5[l] = x[5]; a6[l] = x[6]; a7[l] = x[7];
      b[l] = x[8]; c[l] = x[9];
    }
    for (int64_t i = 0; i < n; i++) {
      a0 = a0 * b + c; a1 = a1 * b + c; a2 = a2 * b + c; a3 = a3 * b + c;
      a4 = a4 * b + c; a5 = a5 * b + c; a6 = a6 * b + c; a7 = a7 * b + c;
    }
    vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    for (int l = 0; l < LANES; l++) total += s[l];
#pragma omp single
    nthreads = omp_get_num_threads();
  }
  y[0] = total;
  y[1] = (float)nthreads;
  y[2] = (float)LANES;
}
