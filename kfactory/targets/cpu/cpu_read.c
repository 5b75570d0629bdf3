/* Read-only memory bandwidth probe for the cpu target's ceilings: a sum over n floats on every thread, nothing
 * written but the sums. A decode step (weights and KV cache) and any reduction read far more than they write, and
 * a read stream can outrun the copy probe (cpu_stream.c), whose stores also cost a read-for-ownership of every
 * line written.
 *
 * Each thread splits its contiguous share into STREAMS parts and reads them side by side, one accumulator one
 * vector register wide per part. Independent accumulators keep the adds' latency (3-4 cycles each) off the
 * critical path, and several streams keep enough cache misses in flight: one core's hardware prefetcher stops at
 * each 4 KiB page boundary, so a single stream leaves it idle there (one thread on the project's host, alternated
 * on one tmpfs buffer at load average 3.5: one stream read a median 7.6-9.0 GB/s, eight 9.9-13.7). STREAMS
 * vectors plus a loaded one fit in the 16 registers of AVX2 (32 of AVX-512) without spilling. Loads go through
 * memcpy: the buffer's offset in its shared memory need not be vector aligned.
 * y[0] receives the sum so the loop cannot be removed; y[1] the number of threads that ran; y[2] the lanes per
 * vector (as cpu_fma.c reports them). */
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
#define STREAMS 8
typedef float vec __attribute__((vector_size(LANES * 4)));

static vec load(const float *p) {
  vec v;
  memcpy(&v, p, sizeof v);
  return v;
}

void kernel(const float *x, float *y, int64_t n) {
  float total = 0.0f;
  int nthreads = 1;
  const int64_t chunk = STREAMS * LANES; /* floats read per iteration */
  const int64_t chunks = n / chunk;
#pragma omp parallel reduction(+ : total)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    /* this thread's share: whole chunks, contiguous; `len` floats per stream */
    int64_t c0 = chunks * t / nt, c1 = chunks * (t + 1) / nt, len = (c1 - c0) * LANES;
    const float *s0 = x + c0 * chunk, *s1 = s0 + len, *s2 = s1 + len, *s3 = s2 + len, *s4 = s3 + len,
                *s5 = s4 + len, *s6 = s5 + len, *s7 = s6 + len;
    vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int64_t i = 0; i < len; i += LANES) {
      a0 += load(s0 + i); a1 += load(s1 + i); a2 += load(s2 + i); a3 += load(s3 + i);
      a4 += load(s4 + i); a5 += load(s5 + i); a6 += load(s6 + i); a7 += load(s7 + i);
    }
    vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    for (int l = 0; l < LANES; l++) total += s[l];
    if (t == nt - 1) /* the tail after the last whole chunk */
      for (int64_t i = chunks * chunk; i < n; i++) total += x[i];
#pragma omp single
    nthreads = nt;
  }
  y[0] = total;
  y[1] = (float)nthreads;
  y[2] = (float)LANES;
}
