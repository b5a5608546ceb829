// Rotary position embedding in the Hugging Face "rotate half" convention: channel j
// pairs with channel j + head_dim/2, inv_freq[i] = theta^(-2i/head_dim).
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// (seq, head_dim/2, 2) table of (cos, sin) for positions 0..seq-1, computed the way
// transformers does (fp32 inverse frequencies, fp32 angles).
Tensor rope_table(int64_t seq, int64_t head_dim, float theta);

// x: (batch, seq, heads, head_dim), f32 or bf16, rotated in place; the table stays f32. A
// bf16 x is rotated in f32 and rounded once per element.
void rope_forward(Device& dev, const Tensor& table, Tensor& x);
// Applies the transpose (inverse) rotation to a gradient (f32 or bf16) in place.
void rope_backward(Device& dev, const Tensor& table, Tensor& dx);

}  // namespace switchyard
