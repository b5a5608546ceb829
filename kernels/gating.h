// Router gating: from fp32 router logits to k (expert, weight) pairs per token.
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// logits: (n, E) f32 -> probs: (n, E) softmax over all experts (saved for backward and
// the aux loss), expert_ids: (n, k) i32 in descending probability (ties: lower expert
// id first), weights: (n, k) f32 = the top-k probabilities, divided by their sum when
// `renormalize` (Mixtral), as they are otherwise (Switch, Qwen2-MoE, OLMoE).
void gating_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                    Tensor& expert_ids, Tensor& weights);
// The router's whole forward in one op: gating_forward's outputs, routing_counts'
// statistics (kernels/router_aux.h: selections, prob_sums (E)) and the router z-loss
// (returned). The CPU runs the three ops; CUDA fuses them into one pass over the logits
// and one host synchronisation (for the z-loss value).
double router_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                      Tensor& expert_ids, Tensor& weights, Tensor& selections, Tensor& prob_sums);
// dweights: (n, k) -> dlogits: (n, E) written, through the top-k selection (held
// fixed), the optional renormalisation and the softmax.
void gating_backward(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                     const Tensor& dweights, bool renormalize, Tensor& dlogits);

// Router z-loss (ST-MoE): mean over rows of logsumexp(logits)^2; returns the value.
// Its gradient, scale * d/dlogits, is accumulated into dlogits by the backward.
double router_z_loss_forward(Device& dev, const Tensor& logits);
void router_z_loss_backward(Device& dev, const Tensor& logits, float scale, Tensor& dlogits);

}  // namespace switchyard
