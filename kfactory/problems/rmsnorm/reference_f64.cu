/* rmsnorm's float64 reference as a device kernel: y = x / sqrt(mean(x^2) + eps) * w per row, in double from the
 * bf16 inputs (exact in double), one thread a row (the judge's truth on the device: problem.yaml reference_f64).
 * The row function is plain C as well: the tests build it for the host and hold it to reference.py. */
#ifdef __CUDACC__
#define KF_HD __host__ __device__
#else
#include <math.h>
#define KF_HD static
#endif

KF_HD double bf16_f64(unsigned short b) {
  union { unsigned int u; float f; } v;
  v.u = (unsigned int)b << 16;
  return (double)v.f;
}

KF_HD void rmsnorm_row_f64(const unsigned short *x, const unsigned short *w, double *y, long long hidden,
                           double eps) {
  double ss = 0.0;
  for (long long h = 0; h < hidden; h++) ss += bf16_f64(x[h]) * bf16_f64(x[h]);
  double inv = 1.0 / sqrt(ss / (double)hidden + eps);
  for (long long h = 0; h < hidden; h++) y[h] = bf16_f64(x[h]) * inv * bf16_f64(w[h]);
}

#ifdef __CUDACC__
extern "C" __global__ void reference_f64(const unsigned short *x, const unsigned short *w, double *y, long long rows,
                                         long long hidden, double eps) {
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x)
    rmsnorm_row_f64(x + r * hidden, w, y + r * hidden, hidden, eps);
}
#else
void reference_f64_host(const unsigned short *x, const unsigned short *w, double *y, long long rows,
                        long long hidden, double eps) {
  for (long long r = 0; r < rows; r++) rmsnorm_row_f64(x + r * hidden, w, y + r * hidden, hidden, eps);
}
#endif
