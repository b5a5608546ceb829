#include <cuda_bf16.h>

#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

__global__ void narrow_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void widen_kernel(const __nv_bfloat16* src, float* dst, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) dst[i] = __bfloat162float(src[i]);
}

__global__ void widen_i32_kernel(const int32_t* src, float* dst, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) dst[i] = static_cast<float>(src[i]);
}

}  // namespace

void narrow_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  narrow_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  SY_CUDA_CHECK_LAUNCH();
}

void widen_from_bf16(const void* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  widen_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), dst,
                                                        n);
  SY_CUDA_CHECK_LAUNCH();
}

void widen_from_i32(const int32_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  widen_i32_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(src, dst, n);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
