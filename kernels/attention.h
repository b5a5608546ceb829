// Causal scaled-dot-product attention with grouped KV heads (query head h reads KV head
// h / (heads / kv_heads)), scale 1/sqrt(head_dim).
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// q, k, v, out and the gradients dout, dq, dk, dv share one dtype, f32 or bf16; probs is
// always f32. With bf16 the scores, softmax and sums run in f32 and each bf16 element
// stored is rounded once.

// q: (batch, seq, heads, head_dim), k, v: (batch, seq, kv_heads, head_dim)
// out: (batch, seq, heads, head_dim); probs: (batch, heads, seq, seq) softmax saved for
// backward (entries above the diagonal are zero).
void attention_forward(Device& dev, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs);
// dq, dk, dv written.
void attention_backward(Device& dev, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& probs, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace switchyard
