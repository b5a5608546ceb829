// CUDA RMSNorm kernels (twins of kernels/cpu/rmsnorm.h): one block per row, rstd in float.
// Templates on the element types of the activations (T: x, y, dy, dx) and of the weight
// (W), each instantiated for float and __nv_bfloat16: elements are loaded as float, sums
// run in float and each stored element is rounded once; rstd and dweight are float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// x: (rows, dim), weight: (dim) -> y: (rows, dim), rstd: (rows).
template <typename T, typename W>
void rmsnorm_forward(const T* x, const W* weight, float eps, int64_t rows, int64_t dim, T* y,
                     float* rstd, cudaStream_t stream);
// dx written; dweight accumulated (column sums in a fixed order).
template <typename T, typename W>
void rmsnorm_backward(const T* dy, const T* x, const W* weight, const float* rstd, int64_t rows,
                      int64_t dim, T* dx, float* dweight, cudaStream_t stream);

}  // namespace switchyard::cuda
