/* Read-only memory bandwidth probe for the cpu target's ceilings: a sum over n floats, each thread streaming its
 * own contiguous share, nothing written but the sums. A decode step (weights and KV cache) and any reduction read
 * far more than they write, and a read stream runs faster than the copy probe (cpu_stream.c), whose stores also
 * cost a read-for-ownership of every line written.
 *
 * Per thread, ACC independent accumulators one vector register wide: the adds of one accumulator wait on each
 * other (3-4 cycles each), so ACC chains keep loads in flight and the memory pipeline, not the add latency, is
 * what limits the loop. ACC vectors plus a loaded one fit in the 16 registers of AVX2 (32 of AVX-512) without
 * spilling. Loads go through memcpy: the buffer's offset in its shared memory need not be vector aligned.
 * y[0] receives the sum so the loop cannot be removed; y[1] the number of threads that ran; y[2] the lanes per
 * vector (as cpu_fma.c reports them, for the caller to check). */
#include <stdint.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define ACC 8
typedef float vec __attribute__((vector_size(LANES * 4)));

static vec load(const float *p) {
  vec v;
  memcpy(&v, p, sizeof v);
  return v;
}

void kernel(const float *x, float *y, int64_t n) {
  float total = 0.0f;
  int nthreads = 1;
  const int64_t step = ACC * LANES;
#pragma omp parallel reduction(+ : total)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    /* contiguous shares in whole steps; the last thread also takes the tail */
    int64_t steps = n / step, lo = steps * t / nt * step, hi = steps * (t + 1) / nt * step;
    vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int64_t i = lo; i < hi; i += step) {
      a0 += load(x + i);             a1 += load(x + i + LANES);
      a2 += load(x + i + 2 * LANES); a3 += load(x + i + 3 * LANES);
      a4 += load(x + i + 4 * LANES); a5 += load(x + i + 5 * LANES);
      a6 += load(x + i + 6 * LANES); a7 += load(x + i + 7 * LANES);
    }
    vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    for (int l = 0; l < LANES; l++) total += s[l];
    if (t == nt - 1)
      for (int64_t i = steps * step; i < n; i++) total += x[i];
#pragma omp single
    nthreads = nt;
  }
  y[0] = total;
  y[1] = (float)nthreads;
  y[2] = (float)LANES;
}
