// CPU RMSNorm kernels: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) per row.
// Row reductions are `omp simd` reductions inside one thread, so their order is fixed at
// compile time and never depends on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// x: (rows, dim), weight: (dim) -> y: (rows, dim), rstd: (rows).
template <typename T>
void rmsnorm_forward(const T* x, const T* weight, T eps, int64_t rows, int64_t dim, T* y, T* rstd) {
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T sum_sq = T(0);
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const T s = T(1) / std::sqrt(sum_sq / static_cast<T>(dim) + eps);
    rstd[r] = s;
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * s * weight[i];
  }
}

// dx written: dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * weight.
// dweight accumulated: dweight += sum over rows of dy * x * rstd.
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, int64_t rows,
                      int64_t dim, T* dx, T* dweight) {
  const bool parallel = rows * dim >= kParallelMinWork;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    T* dxr = dx + r * dim;
    const T s = rstd[r];
    T dot = T(0);
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < dim; ++i) dot += dyr[i] * weight[i] * xr[i];
    const T c = s * s * dot / static_cast<T>(dim);
    for (int64_t i = 0; i < dim; ++i) dxr[i] = s * (dyr[i] * weight[i] - xr[i] * c);
  }
  // Each thread owns a block of columns and walks the rows in order, so the weight
  // gradient is the same for any thread count.
  constexpr int64_t kBlock = 64;
  const int64_t num_blocks = (dim + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t width = std::min(kBlock, dim - begin);
    T acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* dyr = dy + r * dim + begin;
      const T* xr = x + r * dim + begin;
      const T s = rstd[r];
      for (int64_t i = 0; i < width; ++i) acc[i] += dyr[i] * xr[i] * s;
    }
    for (int64_t i = 0; i < width; ++i) dweight[begin + i] += acc[i];
  }
}

}  // namespace switchyard::cpu
