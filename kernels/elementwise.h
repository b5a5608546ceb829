// Small elementwise and reduction ops used by the model and the optimizer.
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// y += alpha * x
void add_(Device& dev, Tensor& y, const Tensor& x, float alpha = 1.0f);
// x *= alpha
void scale_(Device& dev, Tensor& x, float alpha);
// y: (rows, n) += bias: (n) broadcast over rows.
void add_bias_(Device& dev, Tensor& y, const Tensor& bias);
// dbias: (n) += column sums of dy: (rows, n).
void bias_backward(Device& dev, const Tensor& dy, Tensor& dbias);
// Sum of squares of all elements, accumulated in double.
double sum_squares(Device& dev, const Tensor& x);

// Sigmoid-gated rows (Qwen2-MoE shared expert): y[r] += sigmoid(g[r]) * x[r].
// x, y: (rows, n), g: (rows, 1).
void sigmoid_gate_forward(Device& dev, const Tensor& x, const Tensor& g, Tensor& y);
// dx[r] = sigmoid(g[r]) * dy[r] (written); dg[r] = s(1-s) * dot(dy[r], x[r]) (written).
void sigmoid_gate_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& g,
                           Tensor& dx, Tensor& dg);

}  // namespace switchyard
