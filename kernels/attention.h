// Causal scaled-dot-product attention with grouped KV heads (query head h reads KV head
// h / (heads / kv_heads)), scale 1/sqrt(head_dim). Flash-style: the forward saves only each
// query row's log-sum-exp, and the backward recomputes the probabilities from q, k and it.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// q, k, v, out and the gradients dout, dq, dk, dv share one dtype, f32 or bf16; lse is
// always f32. With bf16 the scores, softmax and sums run in f32 and each bf16 element
// stored is rounded once (the CUDA kernels also round the probabilities and their
// gradients to bf16 as tensor-core operands).

// doc_starts, for document-aware attention over packed windows: undefined (every query
// reads all keys up to itself) or (batch, seq) i32 on q's device, where each position's
// document starts in its window (0 <= start_i <= i, non-decreasing along a window); query
// i then reads keys [start_i, i] only. The backward takes the forward's.

// q: (batch, seq, heads, head_dim), k, v: (batch, seq, kv_heads, head_dim)
// -> out: (batch, seq, heads, head_dim) and lse: (batch, heads, seq), each query row's
// log(sum_j exp(score_ij)) over its causal keys, saved for the backward.
void attention_forward(Device& dev, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse, const Tensor& doc_starts = Tensor());
// dout, q, k, v, and out and lse from the forward -> dq, dk, dv, written. The softmax
// backward's row sums sum_j p_ij dp_ij are taken as dout_i . out_i (flash attention's D),
// which is why out is an input.
void attention_backward(Device& dev, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                        Tensor& dk, Tensor& dv, const Tensor& doc_starts = Tensor());

}  // namespace switchyard
