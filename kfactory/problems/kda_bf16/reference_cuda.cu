/*
 * Reference CUDA kernel for the kda_bf16 problem: kda's plain recurrence with bf16 q, k, v, beta and o (raw
 * 16-bit patterns: NVRTC from the wheels has no cuda_bf16.h), fp32 g, h0, ht and fp32 arithmetic; o is
 * rounded to nearest even once.
 * One block per (batch, value head) (launch: grid = B * HV, block = 128, no dynamic shared memory); each
 * thread owns state columns j = threadIdx.x, threadIdx.x + 128, ... and walks the K rows of its columns in
 * global memory (ht, initialised from h0). The L2 norms of q and k are summed by every thread on its own.
 *
 *   S = diag(exp g) S; r = v - S^T k; S += beta k r^T; o = S^T (K^-0.5 q); q, k L2-normalised (eps 1e-6).
 */
#define THREADS 128

__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }

__device__ __forceinline__ unsigned short to_bf(float f) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *g,
       const unsigned short *beta, const float *h0,
       unsigned short *o, float *ht, long long B, long long T, long long H, long long HV, long long K, long long V) {
  const long long bh = blockIdx.x;
  if (bh >= B * HV) return;
  const long long b = bh / HV, hv = bh % HV, h = hv / (HV / H);
  float *S = ht + bh * K * V;
  const float *S0 = h0 + bh * K * V;
  for (long long j = threadIdx.x; j < V; j += THREADS)
    for (long long i = 0; i < K; i++) S[i * V + j] = S0[i * V + j];
  const float scale = rsqrtf((float)K);
  for (long long t = 0; t < T; t++) {
    const unsigned short *qt = q + ((b * T + t) * H + h) * K;
    const unsigned short *kt = k + ((b * T + t) * H + h) * K;
    const long long tv = (b * T + t) * HV + hv;
    float qq = 0.f, kk = 0.f;
    for (long long i = 0; i < K; i++) {
      qq += bf(qt[i]) * bf(qt[i]);
      kk += bf(kt[i]) * bf(kt[i]);
    }
    const float qs = scale / sqrtf(qq + 1e-6f), ks = 1.f / sqrtf(kk + 1e-6f);
    const float bt = bf(beta[tv]);
    for (long long j = threadIdx.x; j < V; j += THREADS) {
      float u = 0.f;
      for (long long i = 0; i < K; i++) {
        const float s = S[i * V + j] * expf(g[tv * K + i]);
        S[i * V + j] = s;
        u += bf(kt[i]) * ks * s;
      }
      const float r = bt * (bf(v[tv * V + j]) - u);
      float acc = 0.f;
      for (long long i = 0; i < K; i++) {
        const float s = S[i * V + j] + bf(kt[i]) * ks * r;
        S[i * V + j] = s;
        acc += bf(qt[i]) * qs * s;
      }
      o[tv * V + j] = to_bf(acc);
    }
  }
}
