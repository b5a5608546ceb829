// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// x: (rows, dim), weight: (dim) -> y: (rows, dim), rstd: (rows) saved for backward.
void rmsnorm_forward(Device& dev, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                     Tensor& rstd);
// dx written, dweight accumulated.
void rmsnorm_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight);

}  // namespace switchyard
