// CUDA RMSNorm kernels (twins of kernels/cpu/rmsnorm.h): one block per row, rstd in float.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// x: (rows, dim), weight: (dim) -> y: (rows, dim), rstd: (rows).
template <typename T>
void rmsnorm_forward(const T* x, const T* weight, float eps, int64_t rows, int64_t dim, T* y,
                     float* rstd, cudaStream_t stream);
// dx written; dweight accumulated (column sums in a fixed order).
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const float* rstd, int64_t rows,
                      int64_t dim, T* dx, T* dweight, cudaStream_t stream);

}  // namespace switchyard::cuda
