// Rotary position embedding in the Hugging Face "rotate half" convention: channel j
// pairs with channel j + head_dim/2, inv_freq[i] = theta^(-2i/head_dim).
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// (seq, head_dim/2, 2) table of (cos, sin) for positions 0..seq-1, computed the way
// transformers does (fp32 inverse frequencies, fp32 angles).
Tensor rope_table(int64_t seq, int64_t head_dim, float theta);

// YaRN's parameters (the recipe's model.rope_scaling, core/config/recipe.proto, where
// the formulas are), beta_fast and beta_slow resolved.
struct YarnScaling {
  double factor;
  int64_t original_max_positions;
  double beta_fast, beta_slow;
  double mscale, mscale_all_dim;
};

// YaRN's m(scale, k): 0.1 k ln(scale) + 1 for scale > 1, else 1.
double yarn_mscale(double scale, double k);
// The (seq, head_dim/2, 2) table of YaRN's blended inverse frequencies, cos and sin
// multiplied by its attention factor, as transformers computes them.
Tensor yarn_rope_table(int64_t seq, int64_t head_dim, float theta, const YarnScaling& yarn);

// x: (batch, seq, heads, head_dim), f32 or bf16, rotated in place; the table stays f32. A
// bf16 x is rotated in f32 and rounded once per element.
void rope_forward(Device& dev, const Tensor& table, Tensor& x);
// Applies the transpose (inverse) rotation to a gradient (f32 or bf16) in place.
void rope_backward(Device& dev, const Tensor& table, Tensor& dx);

}  // namespace switchyard
