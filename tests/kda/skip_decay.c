/* WRONG kda kernel for tests/test_kda.py: the decay diag(exp g) is never applied
 * (reference_cpu.c with one change; the verifier must reject it as wrong_result). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KMAX 256

static void normalise(const float *x, float *out, int64_t K, float scale) {
  float ss = 0.0f;
  for (int64_t i = 0; i < K; i++) ss += x[i] * x[i];
  const float inv = scale / sqrtf(ss + 1e-6f);
  for (int64_t i = 0; i < K; i++) out[i] = x[i] * inv;
}

void kernel(const float *q, const float *k, const float *v, const float *g, const float *beta,
            const float *h0, float *o, float *ht, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K,
            int64_t V) {
  const int64_t G = HV / H;
  const float scale = 1.0f / sqrtf((float)K);
#pragma omp parallel for
  for (int64_t bh = 0; bh < B * HV; bh++) {
    const int64_t b = bh / HV, hv = bh % HV, h = hv / G;
    float *S = ht + bh * K * V;
    float qn[KMAX], kn[KMAX];
    float r[V];
    memcpy(S, h0 + bh * K * V, (size_t)(K * V) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
      const int64_t qk = ((b * T + t) * H + h) * K;
      const int64_t tv = (b * T + t) * HV + hv;
      normalise(q + qk, qn, K, scale);
      normalise(k + qk, kn, K, 1.0f);
      for (int64_t i = 0; i < K; i++) {
        const float d = 1.0f; /* decay skipped */
        for (int64_t j = 0; j < V; j++) S[i * V + j] *= d;
      }
      for (int64_t j = 0; j < V; j++) {
        float u = 0.0f;
        for (int64_t i = 0; i < K; i++) u += kn[i] * S[i * V + j];
        r[j] = v[tv * V + j] - u;
      }
      const float bt = beta[tv];
      for (int64_t i = 0; i < K; i++) {
        const float bk = bt * kn[i];
        for (int64_t j = 0; j < V; j++) S[i * V + j] += bk * r[j];
      }
      for (int64_t j = 0; j < V; j++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < K; i++) acc += qn[i] * S[i * V + j];
        o[tv * V + j] = acc;
      }
    }
  }
}
