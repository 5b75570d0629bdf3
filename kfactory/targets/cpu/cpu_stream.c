/* Memory bandwidth probe for the cpu target's speed-of-light ceiling: one read and one write per
 * element, like a row softmax's floor, spread over OMP_NUM_THREADS threads. */
#include <stdint.h>

void kernel(const float *x, float *y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * 1.000001f;
}
