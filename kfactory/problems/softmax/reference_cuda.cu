/*
 * Reference CUDA kernel for the softmax problem: the plain version a careful non-expert writes.
 * One block per row (launch: grid = rows, block = 256, no dynamic shared memory), scalar loads,
 * three passes over the row: max | sum of expf(x - max) | write expf(x - max) / sum, each
 * reduced with a shared-memory tree. IEEE expf and division (no fast math).
 *
 *   y[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r)
 *
 * -inf entries (masked positions) give expf(-inf) == 0; a row is never all -inf, so the
 * maximum is finite. Offsets are 64-bit.
 */
#define THREADS 256

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
kernel(const float *x, float *y, long long rows, long long cols) {
  __shared__ float buf[THREADS];
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const float *xr = x + r * cols;
  float *yr = y + r * cols;

  /* Pass 1: row maximum (for numerical stability). */
  float m = -__int_as_float(0x7f800000); /* -inf (NVRTC has no math.h INFINITY) */
  for (long long c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
  m = block_max(m, buf);

  /* Pass 2: sum of exp(x - max). */
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - m);
  s = block_sum(s, buf);

  /* Pass 3: normalised output. */
  for (long long c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(xr[c] - m) / s;
}
