#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/muon.h"

namespace switchyard::cuda {
namespace {

__global__ void muon_momentum_kernel(const float* grad, float* momentum, float* input, int64_t n,
                                     float mu, bool nesterov, float grad_scale) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = grad[i] * grad_scale;
    const float m = mu * momentum[i] + g;
    momentum[i] = m;
    input[i] = nesterov ? g + mu * m : m;
  }
}

__global__ void muon_apply_kernel(float* param, const float* update, __nv_bfloat16* work,
                                  int64_t n, float decay, float step) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float p = param[i] * decay - step * update[i];
    param[i] = p;
    if (work) work[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

void muon_momentum(const float* grad, float* momentum, float* input, int64_t n, float mu,
                   bool nesterov, float grad_scale, cudaStream_t stream) {
  if (n == 0) return;
  muon_momentum_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(grad, momentum, input, n, mu,
                                                                 nesterov, grad_scale);
  SY_CUDA_CHECK_LAUNCH();
}

void muon_apply(float* param, const float* update, void* work, int64_t n, float decay,
                float step, cudaStream_t stream) {
  if (n == 0) return;
  muon_apply_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(
      param, update, static_cast<__nv_bfloat16*>(work), n, decay, step);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
