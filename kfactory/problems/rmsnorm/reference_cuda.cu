/*
 * Reference CUDA kernel for the rmsnorm problem: the plain version a careful non-expert writes.
 * One block per row (launch: grid = rows, block = 256, no dynamic shared memory); scalar bf16 loads;
 * pass 1 sums x^2 in fp32 per thread, a shared-memory tree adds the 256 partials; pass 2 writes
 * y = bf16(x * rstd * w), rounded to nearest even once; eps is the problem's param, passed as an argument.
 *
 * bf16 values are raw 16-bit patterns (unsigned short): NVRTC from the PyPI wheels has no cuda_bf16.h.
 */
#define THREADS 256

__device__ __forceinline__ float bf16_to_f32(unsigned short h) {
  return __uint_as_float((unsigned int)h << 16);
}

__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const unsigned short *x, const unsigned short *w, unsigned short *y, long long rows, long long hidden,
       float eps) {
  __shared__ float partial[THREADS];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const unsigned short *xr = x + r * hidden;
  unsigned short *yr = y + r * hidden;

  /* Pass 1: sum of squares in fp32. */
  float ss = 0.f;
  for (long long c = threadIdx.x; c < hidden; c += THREADS) {
    const float v = bf16_to_f32(xr[c]);
    ss += v * v;
  }
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float rstd = 1.f / sqrtf(partial[0] / (float)hidden + eps);

  /* Pass 2: normalise, scale, round once. */
  for (long long c = threadIdx.x; c < hidden; c += THREADS) {
    yr[c] = f32_to_bf16(bf16_to_f32(xr[c]) * rstd * bf16_to_f32(w[c]));
  }
}
