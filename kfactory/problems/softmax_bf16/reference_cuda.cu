/*
 * Reference CUDA kernel for the softmax_bf16 problem: the plain version a careful non-expert writes.
 * One block per row (launch: grid = rows, block = 256, no dynamic shared memory), scalar bf16 loads,
 * three passes over the row in fp32: max | sum of expf(x - max) | write bf16(expf(x - max) / sum),
 * each reduced with a shared-memory tree. IEEE expf and division (no fast math); one rounding to bf16
 * (nearest even) per output.
 *
 * bf16 values are raw 16-bit patterns (unsigned short): NVRTC from the PyPI wheels has no cuda_bf16.h.
 * -inf entries (masked positions) give expf(-inf) == 0; a row is never all -inf, so the maximum is
 * finite. Offsets are 64-bit.
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

__device__ float block_max(float v, float *buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  v = buf[0];
  __syncthreads();
  return v;
}

__device__ float block_sum(float v, float *buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  v = buf[0];
  __syncthreads();
  return v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const unsigned short *x, unsigned short *y, long long rows, long long cols) {
  __shared__ float buf[THREADS];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const unsigned short *xr = x + r * cols;
  unsigned short *yr = y + r * cols;

  /* Pass 1: row maximum (for numerical stability). */
  float m = -__int_as_float(0x7f800000); /* -inf (NVRTC has no math.h INFINITY) */
  for (long long c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, bf16_to_f32(xr[c]));
  m = block_max(m, buf);

  /* Pass 2: sum of exp(x - max) in fp32. */
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += THREADS) s += expf(bf16_to_f32(xr[c]) - m);
  s = block_sum(s, buf);

  /* Pass 3: normalised output, rounded to bf16 once. */
  for (long long c = threadIdx.x; c < cols; c += THREADS) yr[c] = f32_to_bf16(expf(bf16_to_f32(xr[c]) - m) / s);
}
