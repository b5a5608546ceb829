#include "kernels/cuda/columns.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// One thread per element of the block.
template <typename T>
__global__ void copy_columns_kernel(const T* src, int64_t ld_src, T* dst, int64_t ld_dst,
                                    int64_t rows, int64_t width, bool accumulate) {
  const int64_t n = rows * width;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / width, j = i % width;
    const T value = src[r * ld_src + j];
    T* to = dst + r * ld_dst + j;
    *to = accumulate ? static_cast<T>(static_cast<float>(*to) + static_cast<float>(value)) : value;
  }
}

}  // namespace

template <typename T>
void copy_columns(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows,
                  int64_t width, bool accumulate, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n == 0) return;
  copy_columns_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(src, ld_src, dst, ld_dst, rows,
                                                               width, accumulate);
  SY_CUDA_CHECK_LAUNCH();
}

template void copy_columns<float>(const float*, int64_t, float*, int64_t, int64_t, int64_t, bool,
                                  cudaStream_t);
template void copy_columns<__nv_bfloat16>(const __nv_bfloat16*, int64_t, __nv_bfloat16*, int64_t,
                                          int64_t, int64_t, bool, cudaStream_t);

}  // namespace switchyard::cuda
