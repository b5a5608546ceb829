// AdamW with fp32 state (decoupled weight decay, bias-corrected moments).
#pragma once

#include "engine/runtime/tensor.h"

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
// from grad * grad_scale (grad_scale folds in clipping).
void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale, Tensor& param,
                const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq);

}  // namespace switchyard
