// Router gating: from fp32 router logits to k (expert, weight) pairs per token.
#pragma once

#include "core/runtime/tensor.h"
#include "kernels/top_k_selection.h"

namespace switchyard {

// logits: (n, E) f32 -> probs: (n, E) softmax over all experts (saved for backward and
// the aux loss), expert_ids: (n, k) i32 in descending probability (ties: lower expert
// id first), weights: (n, k) f32 = the top-k probabilities, divided by their sum when
// `renormalize` (Mixtral), as they are otherwise (Switch, Qwen2-MoE, OLMoE).
void gating_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                    Tensor& expert_ids, Tensor& weights);
// The router's whole forward in one op: gating_forward's outputs and the routing sums
// a forward records, sums: (2E + 1) f32 written on `dev` = routing_counts' selections
// (E) and prob_sums (E) (kernels/router_aux.h), then router_z_loss_sum. Nothing waits
// for the host. CUDA fuses the three into one pass over the logits.
void router_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                    Tensor& expert_ids, Tensor& weights, Tensor& sums);
// GShard's random dispatch of the second expert: dispatch_ids (n, 2) i32 written =
// expert_ids, except that token t's second expert becomes -1 (not sent) when
// u_t >= 2 * weights[t, 1], where u_t = Rng::uniform_at(seed, first_draw + t) (the draws
// of one Rng stream in token order). expert_ids and weights are (n, 2).
void gshard_dispatch_ids(Device& dev, const Tensor& expert_ids, const Tensor& weights,
                         uint64_t seed, uint64_t first_draw, Tensor& dispatch_ids);
// dweights: (n, k) -> dlogits: (n, E) written, through the top-k selection (held
// fixed), the optional renormalisation and the softmax. An expert id of -1 (no expert)
// selects nothing: the row's gradient is that of its other slots alone.
void gating_backward(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                     const Tensor& dweights, bool renormalize, Tensor& dlogits);

// The sigmoid router (moe.score_function SIGMOID; SigmoidGating in kernels/top_k_selection.h):
// logits (n, E) f32 and the experts' selection bias (E) f32 -> scores (n, E) =
// sigmoid(logits) (saved for backward), expert_ids (n, k) i32 in descending score + bias
// among the chosen groups (ties: lower expert id first), weights (n, k) f32 = the chosen
// scores, divided by their sum when g.renormalize, times g.scaling.
void sigmoid_gating_forward(Device& dev, const Tensor& logits, const Tensor& bias,
                            const SigmoidGating& g, Tensor& scores, Tensor& expert_ids,
                            Tensor& weights);
// router_forward's twin for the sigmoid router: sums (2E + 1) f32 = the top-k selections
// per expert, the column sums of the scores and router_z_loss_sum, on `dev`.
void sigmoid_router_forward(Device& dev, const Tensor& logits, const Tensor& bias,
                            const SigmoidGating& g, Tensor& scores, Tensor& expert_ids,
                            Tensor& weights, Tensor& sums);
// dweights: (n, k) -> dlogits: (n, E) written, through the weights and the sigmoid, the
// selection held fixed (the bias only selects, so it has no gradient). An expert id of -1
// selects nothing, as in gating_backward.
void sigmoid_gating_backward(Device& dev, const Tensor& scores, const Tensor& expert_ids,
                             const Tensor& dweights, const SigmoidGating& g, Tensor& dlogits);
// moe.router_force_balance: expert_ids (n, k) i32 and weights (n, k) f32 written as
// token first_token + t's round-robin experts ((first_token + t) k + j) mod num_experts,
// each of weight 1 / k, whatever the router says.
void round_robin_routing(Device& dev, int64_t first_token, int num_experts, Tensor& expert_ids,
                         Tensor& weights);

// Expert choice (moe.gating EXPERT_CHOICE, Zhou et al. 2022): each expert takes the
// `capacity` tokens of the batch with the highest probability for it (ties: the lower
// token; expert_takes_token in kernels/top_k_selection.h). probs (n, E) f32 ->
// expert_ids (n, E) i32 = e where expert e took token t, else -1, and weights (n, E) f32
// = the probability there, else 0. A token may go to no expert or to several.
void expert_choice_forward(Device& dev, const Tensor& probs, int64_t capacity, Tensor& expert_ids,
                           Tensor& weights);
// router_forward's twin for expert choice: logits (n, E) -> probs (softmax), the choice,
// and sums (2E + 1) = tokens taken per expert, probability sums, z-loss sum.
void expert_choice_router_forward(Device& dev, const Tensor& logits, int64_t capacity,
                                  Tensor& probs, Tensor& expert_ids, Tensor& weights,
                                  Tensor& sums);
// dweights (n, E) -> dlogits (n, E) written, through the softmax, the choice held fixed.
void expert_choice_backward(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                            const Tensor& dweights, Tensor& dlogits);

// Router z-loss (ST-MoE): the mean over rows of logsumexp(logits)^2. z_sum: (1) f32
// written on `dev`, the sum over rows (in double, rounded once): sums over ranks add up,
// and the reader divides by the rows. Its gradient, scale * d(mean)/dlogits, is
// accumulated into dlogits by the backward.
void router_z_loss_sum(Device& dev, const Tensor& logits, Tensor& z_sum);
void router_z_loss_backward(Device& dev, const Tensor& logits, float scale, Tensor& dlogits);

}  // namespace switchyard
