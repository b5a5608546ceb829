// AdamW with fp32 state (decoupled weight decay, bias-corrected moments).
#pragma once

#include <vector>

#include "core/runtime/tensor.h"

namespace switchyard {

struct AdamWHyper {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  int64_t step;  // 1-based step count, for bias correction
};

// param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param), with m, v updated
// from grad * grad_scale (grad_scale folds in clipping). All f32.
void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale, Tensor& param,
                const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq);

// One tensor of a multi-tensor step.
struct AdamWUpdate {
  Tensor* param;  // f32 master, updated
  const Tensor* grad;
  Tensor* exp_avg;
  Tensor* exp_avg_sq;
  bool decay;              // whether h.weight_decay applies to this tensor
  Tensor* work = nullptr;  // bf16 working copy to write from the new value, or null
};

// The same step over many tensors at once: one kernel launch on CUDA, with each bf16
// working copy written in the same pass (the values are those of adamw_step).
void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale,
                const std::vector<AdamWUpdate>& updates);

}  // namespace switchyard
