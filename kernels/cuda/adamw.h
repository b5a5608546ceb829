// CUDA AdamW step (twin of kernels/cpu/adamw.h), in the operation order of
// torch.optim.AdamW's single-tensor path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// One step over n elements; the scalar factors are formed in double on the host, as
// PyTorch does from Python floats, then applied in float. step is 1-based.
template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step,
                double grad_scale, cudaStream_t stream);

}  // namespace switchyard::cuda
