// CUDA AdamW step (twin of kernels/cpu/adamw.h), in the operation order of
// torch.optim.AdamW's single-tensor path, over many tensors in one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace switchyard::cuda {

// One tensor's fp32 state; `work` (bf16, may be null) receives the updated value rounded
// to bf16 in the same pass.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* work;
  int64_t n;
  bool decay;  // whether weight decay applies
};

// The kernel's work list: the tensors cut into chunks of at most 64K elements, each with
// its weight-decay factor (1 - lr * weight_decay, or 1).
struct AdamWChunk {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* work;
  int64_t begin, end;  // element range within the tensor
  float decay;
};
std::vector<AdamWChunk> adamw_chunks(const std::vector<AdamWTensor>& tensors, double lr,
                                     double weight_decay);

// One step over the `count` chunks at `chunks` (adamw_chunks' list, in device memory), one
// kernel launch. The scalar factors are formed in double on the host, as PyTorch does from
// Python floats, then applied in float. step is 1-based.
void adamw_step(const AdamWChunk* chunks, int64_t count, double lr, double beta1, double beta2,
                double eps, int64_t step, double grad_scale, cudaStream_t stream);

}  // namespace switchyard::cuda
