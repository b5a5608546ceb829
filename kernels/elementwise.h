// Small elementwise and reduction ops used by the model and the optimizer.
//
// Operands are f32 or bf16 as each op states. With bf16 operands the arithmetic and the
// sums run in f32 (bf16 loads widened exactly) and each bf16 element stored is rounded
// once; parameter gradients (dbias) stay f32.
#pragma once

#include <vector>

#include "core/runtime/exact_sum.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// y += alpha * x. y and x both f32 or both bf16.
void add_(Device& dev, Tensor& y, const Tensor& x, float alpha = 1.0f);
// x *= alpha. x f32 or bf16.
void scale_(Device& dev, Tensor& x, float alpha);
// y: (rows, n) += bias: (n) broadcast over rows. y and bias each f32 or bf16.
void add_bias_(Device& dev, Tensor& y, const Tensor& bias);
// dbias: (n) f32 += column sums of dy: (rows, n), f32 or bf16.
void bias_backward(Device& dev, const Tensor& dy, Tensor& dbias);
// Sums of squares of the elements of each tensor (f32 or bf16, one dtype for all),
// accumulated in double in a fixed order. On CUDA the host waits once for all of them.
std::vector<double> sum_squares(Device& dev, const std::vector<Tensor>& xs);
// The same for one tensor.
double sum_squares(Device& dev, const Tensor& x);
// Sums of squares of each tensor, exact over its rows (dimension 0): each row's sum in
// double in an order fixed by the row's length (on the CPU as sum_squares gives it), the
// rows' sums added exactly. A tensor split into ranges of rows
// (expert shards, ZeRO row shards) gives, summed exactly over its parts, the whole
// tensor's bits.
std::vector<ExactSum> row_sum_squares(Device& dev, const std::vector<Tensor>& xs);

// Sigmoid-gated rows (Qwen2-MoE shared expert): y[r] += sigmoid(g[r]) * x[r].
// x, y: (rows, n), both f32 or both bf16; g: (rows, 1), f32 or bf16.
void sigmoid_gate_forward(Device& dev, const Tensor& x, const Tensor& g, Tensor& y);
// dx[r] = sigmoid(g[r]) * dy[r] (written); dg[r] = s(1-s) * dot(dy[r], x[r]) (written).
// dy, x, dx all f32 or all bf16; g, dg both f32 or both bf16.
void sigmoid_gate_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& g,
                           Tensor& dx, Tensor& dg);

}  // namespace switchyard
