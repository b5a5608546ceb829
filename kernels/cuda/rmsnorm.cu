#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

template <typename T, typename W>
__global__ void rmsnorm_forward_kernel(const T* x, const W* weight, float eps, int64_t rows,
                                       int64_t dim, T* y, float* rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    float sum_sq = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = static_cast<float>(xr[i]);
      sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq);
    const float s = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      y[r * dim + i] =
          static_cast<T>(static_cast<float>(xr[i]) * s * static_cast<float>(weight[i]));
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * weight.
template <typename T, typename W>
__global__ void rmsnorm_backward_kernel(const T* dy, const T* x, const W* weight, const float* rstd,
                                        int64_t rows, int64_t dim, T* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* dyr = dy + r * dim;
    const T* xr = x + r * dim;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      dot += static_cast<float>(dyr[i]) * static_cast<float>(weight[i]) * static_cast<float>(xr[i]);
    dot = block_sum(dot);
    const float c = s * s * dot / static_cast<float>(dim);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float g = static_cast<float>(dyr[i]) * static_cast<float>(weight[i]);
      dx[r * dim + i] = static_cast<T>(s * (g - static_cast<float>(xr[i]) * c));
    }
  }
}

// dweight term: dy * x * rstd of one element.
template <typename T>
struct WeightGradTerm {
  const T* dy;
  const T* x;
  const float* rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const {
    return static_cast<float>(dy[r * dim + c]) * static_cast<float>(x[r * dim + c]) * rstd[r];
  }
};

}  // namespace

template <typename T, typename W>
void rmsnorm_forward(const T* x, const W* weight, float eps, int64_t rows, int64_t dim, T* y,
                     float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<<<grid_blocks(rows, 1), kThreads, 0, stream>>>(x, weight, eps, rows, dim,
                                                                        y, rstd);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T, typename W>
void rmsnorm_backward(const T* dy, const T* x, const W* weight, const float* rstd, int64_t rows,
                      int64_t dim, T* dx, float* dweight, cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_backward_kernel<<<grid_blocks(rows, 1), kThreads, 0, stream>>>(dy, x, weight, rstd, rows,
                                                                         dim, dx);
  SY_CUDA_CHECK_LAUNCH();
  column_sums_accumulate(rows, dim, WeightGradTerm<T>{dy, x, rstd, dim}, dweight, stream);
}

#define SY_INSTANTIATE_RMSNORM(T, W)                                                           \
  template void rmsnorm_forward<T, W>(const T*, const W*, float, int64_t, int64_t, T*, float*, \
                                      cudaStream_t);                                           \
  template void rmsnorm_backward<T, W>(const T*, const T*, const W*, const float*, int64_t,    \
                                       int64_t, T*, float*, cudaStream_t);
SY_INSTANTIATE_RMSNORM(float, float)
SY_INSTANTIATE_RMSNORM(float, __nv_bfloat16)
SY_INSTANTIATE_RMSNORM(__nv_bfloat16, float)
SY_INSTANTIATE_RMSNORM(__nv_bfloat16, __nv_bfloat16)
#undef SY_INSTANTIATE_RMSNORM

}  // namespace switchyard::cuda
