// CUDA kernels of Muon's elementwise steps (twins of kernels/cpu/muon.h); the
// orthogonalisation's products run through the matmul op.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// momentum = mu * momentum + grad_scale * grad; input = grad_scale * grad + mu * momentum
// (Nesterov) or momentum.
void muon_momentum(const float* grad, float* momentum, float* input, int64_t n, float mu,
                   bool nesterov, float grad_scale, cudaStream_t stream);

// param = param * decay - step * update; `work` (bf16, may be null) gets the new value
// rounded.
void muon_apply(float* param, const float* update, void* work, int64_t n, float decay,
                float step, cudaStream_t stream);

}  // namespace switchyard::cuda
