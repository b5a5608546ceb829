// Muon: momentum orthogonalised by Newton-Schulz iterations (Keller Jordan's Muon, with
// the decoupled weight decay and the update scale of Moonlight's "Muon is scalable").
// Three ops, so that the momentum and the update run on any part of a matrix (a ZeRO row
// shard, a tensor-parallel shard) while the orthogonalisation takes matrices whole.
#pragma once

#include <cstdint>

#include "core/runtime/tensor.h"

namespace switchyard {

// momentum = mu * momentum + grad_scale * grad; then input = grad_scale * grad + mu *
// momentum (Nesterov) or momentum. All f32 with one element count; grad_scale folds in
// clipping.
void muon_momentum(Device& dev, float mu, bool nesterov, float grad_scale, const Tensor& grad,
                   Tensor& momentum, Tensor& input);

// The quintic Newton-Schulz iteration.
struct NewtonSchulz {
  int steps;
  float a, b, c;  // X = a X + (b A + c A A) X, A = X X^T
  float eps;      // X / (||X||_F + eps) before the first step
};

// x (f32) read as x.numel() / (rows * cols) matrices of (rows, cols), each replaced by its
// orthogonalisation: normalised by its Frobenius norm, then `steps` iterations on its wide
// orientation (X^T where rows > cols). The products go through matmul, so under
// runtime.batch_invariant a matrix gives the same bits on every rank.
void muon_orthogonalize(Device& dev, const NewtonSchulz& ns, Tensor& x, int64_t rows,
                        int64_t cols);

// The factor Muon's update takes so that its RMS is `update_rms` (that of AdamW's
// updates, so that one learning rate serves both): an orthogonalised (rows, cols) matrix
// has an RMS of about 1 / sqrt(max(rows, cols)).
double muon_update_scale(double update_rms, int64_t rows, int64_t cols);

// param = param * (1 - lr * weight_decay) - lr * scale * update, and `work` (bf16, may be
// null) rounded from the new value in the same pass. param and update f32, one count.
void muon_apply(Device& dev, double lr, double weight_decay, double scale, Tensor& param,
                const Tensor& update, Tensor* work);

}  // namespace switchyard
