// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// Activations (x, y, dy, dx) are all f32 or all bf16 in a call and the weight f32 or bf16
// on its own; rstd and dweight are always f32. With bf16 operands the sums and arithmetic
// run in f32 and each bf16 element stored is rounded once.

// x: (rows, dim), weight: (dim) -> y: (rows, dim), rstd: (rows) saved for backward.
void rmsnorm_forward(Device& dev, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                     Tensor& rstd);
// dx written, dweight accumulated.
void rmsnorm_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight);

}  // namespace switchyard
