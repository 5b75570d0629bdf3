/* The judge's own device kernels (never a candidate's): drawing a verification input in place from its recorded
 * seed (kf_draw.h) and comparing an output with its float64 reference in per-block partials (kf_compare.h).
 * Built by NVRTC with --fmad=false (kfactory/targets/cuda/judge_kernels.py); built as host C by the tests, where
 * the same element functions run in plain loops (the #else branch). */
#include "kf_draw.h"
#include "kf_compare.h"

/* threads per block of kf_compare: its shared-memory tree needs a power of two */
#define KF_COMPARE_THREADS 256

/* whether element i of two outputs differs in value: a NaN equals a NaN and -0 equals 0, as the host's
 * same-answer-twice checks count (kfactory.judge.numerics.differing_elements) */
KF_HD int kf_unequal(const void *a, const void *b, int dtype, long long i) {
  double x = kf_load(a, dtype, i), y = kf_load(b, dtype, i);
  return !(x == y || (x != x && y != y));
}

#ifdef __CUDACC__

extern "C" __global__ void kf_draw(void *out, int dtype, long long n, long long cols, unsigned long long seed,
                                   unsigned int tensor, int kind, double a, double b, double neg_inf) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    kf_draw_one(out, dtype, (kf_u64)i, (kf_u64)cols, seed, tensor, kind, a, b, neg_inf);
}

/* one kf_stats per block into partials[blockIdx.x]; launch with KF_COMPARE_THREADS threads a block */
extern "C" __global__ void kf_compare(const void *out, int dtype, const double *ref, long long n, double atol,
                                      double rtol, kf_stats *partials) {
  __shared__ kf_stats part[KF_COMPARE_THREADS];
  kf_stats s;
  kf_stats_init(&s);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    kf_stats_add(&s, kf_load(out, dtype, i), ref[i], i, atol, rtol);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = KF_COMPARE_THREADS / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) kf_stats_merge(&part[threadIdx.x], &part[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = part[0];
}

/* how many of n elements of `dtype` differ in value between a and b, added to *count (one run's output against
 * another's: the same answer twice) */
extern "C" __global__ void kf_count_unequal(const void *a, const void *b, int dtype, long long n,
                                            unsigned long long *count) {
  unsigned long long local = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    local += kf_unequal(a, b, dtype, i);
  if (local) atomicAdd(count, local);
}

/* how many of n bytes differ between a and b, added to *count (an input against its redrawn self: what the
 * kernel wrote into it, whatever the value) */
extern "C" __global__ void kf_count_diff(const unsigned char *a, const unsigned char *b, long long n,
                                         unsigned long long *count) {
  unsigned long long local = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(count, local);
}

#else

/* the host's twin loops over the same element functions (tests; a GPU-less fake driver) */
void kf_draw_host(void *out, int dtype, long long n, long long cols, unsigned long long seed, unsigned int tensor,
                  int kind, double a, double b, double neg_inf) {
  for (long long i = 0; i < n; i++) kf_draw_one(out, dtype, (kf_u64)i, (kf_u64)cols, seed, tensor, kind, a, b, neg_inf);
}

void kf_count_diff_host(const unsigned char *a, const unsigned char *b, long long n, unsigned long long *count) {
  for (long long i = 0; i < n; i++) *count += a[i] != b[i];
}

void kf_count_unequal_host(const void *a, const void *b, int dtype, long long n, unsigned long long *count) {
  for (long long i = 0; i < n; i++) *count += kf_unequal(a, b, dtype, i);
}

/* kf_compare's partials as a grid of `blocks` x KF_COMPARE_THREADS threads would leave them (each thread's
 * strided elements, merged in the block's tree order) */
void kf_compare_host(const void *out, int dtype, const double *ref, long long n, double atol, double rtol,
                     int blocks, kf_stats *partials) {
  kf_stats part[KF_COMPARE_THREADS];
  long long stride = (long long)blocks * KF_COMPARE_THREADS;
  for (int bk = 0; bk < blocks; bk++) {
    for (int t = 0; t < KF_COMPARE_THREADS; t++) {
      kf_stats_init(&part[t]);
      for (long long i = (long long)bk * KF_COMPARE_THREADS + t; i < n; i += stride)
        kf_stats_add(&part[t], kf_load(out, dtype, i), ref[i], i, atol, rtol);
    }
    for (int half = KF_COMPARE_THREADS / 2; half > 0; half /= 2)
      for (int t = 0; t < half; t++) kf_stats_merge(&part[t], &part[t + half]);
    partials[bk] = part[0];
  }
}

#endif
