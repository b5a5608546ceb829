// CUDA router gating kernels (twins of kernels/cpu/gating.h): softmax over experts,
// top-k, optional renormalisation, the sigmoid router, expert choice, their backward,
// round-robin routing, and the router z-loss. The router
// runs in fp32, so these are not templates. One thread per token row: router rows are
// short (E experts), and the selection follows the CPU kernel step by step, ties and
// NaNs included.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/top_k_selection.h"

namespace switchyard::cuda {

// logits: (n, E) -> probs: (n, E), expert_ids: (n, k) by rank, weights: (n, k).
void gating_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                    int64_t n, int64_t num_experts, int k, bool renormalize, cudaStream_t stream);
// gating_forward, routing_counts (kernels/cuda/router_aux.h) and router_z_loss_sum in
// one pass over the logits: also writes sums: (2E + 1) = the top-k selections per expert
// (E), the column sums of probs (E) and the z-loss sum (1), on the device. For
// num_experts <= kFusedRouterMaxExperts.
inline constexpr int64_t kFusedRouterMaxExperts = 2048;
void router_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                    float* sums, int64_t n, int64_t num_experts, int k, bool renormalize,
                    cudaStream_t stream);
// GShard's second-expert dispatch (kernels/gating.h): one thread per token draws
// Rng::uniform_at(seed, first_draw + t), as the CPU does.
void gshard_dispatch_ids(const int32_t* expert_ids, const float* weights, int64_t n, uint64_t seed,
                         uint64_t first_draw, int32_t* dispatch_ids, cudaStream_t stream);
// dweights: (n, k) -> dlogits: (n, E) written, the selection held fixed (ids of -1
// skipped).
void gating_backward(const float* probs, const int32_t* expert_ids, const float* dweights,
                     float* dlogits, int64_t n, int64_t num_experts, int k, bool renormalize,
                     cudaStream_t stream);
// The sigmoid router (kernels/gating.h): scores = sigmoid(logits), the group-limited
// top-k by score + bias, the weights from the scores.
void sigmoid_gating_forward(const float* logits, const float* bias, float* scores,
                            int32_t* expert_ids, float* weights, int64_t n, int64_t num_experts,
                            const SigmoidGating& g, cudaStream_t stream);
// dweights: (n, k) -> dlogits: (n, E) written, the selection held fixed (ids of -1
// skipped).
void sigmoid_gating_backward(const float* scores, const int32_t* expert_ids,
                             const float* dweights, float* dlogits, int64_t n,
                             int64_t num_experts, const SigmoidGating& g, cudaStream_t stream);
// Expert choice (kernels/gating.h): one thread per (token, expert) pair ranks the token
// among the n for that expert (expert_takes_token).
void expert_choice_forward(const float* probs, int32_t* expert_ids, float* weights, int64_t n,
                           int64_t num_experts, int64_t capacity, cudaStream_t stream);
// dweights: (n, E) -> dlogits: (n, E) written, the choice held fixed.
void expert_choice_backward(const float* probs, const int32_t* expert_ids, const float* dweights,
                            float* dlogits, int64_t n, int64_t num_experts, cudaStream_t stream);
// Round-robin routing (moe.router_force_balance): token first_token + t to experts
// ((first_token + t) k + j) mod num_experts, each of weight 1 / k.
void round_robin_routing(int64_t first_token, int32_t* expert_ids, float* weights, int64_t n,
                         int64_t num_experts, int k, cudaStream_t stream);
// z_sum (one float on the device) = the sum over the n rows of logsumexp(row)^2,
// summed in double in a fixed order.
void router_z_loss_sum(const float* logits, int64_t n, int64_t num_experts, float* z_sum,
                       cudaStream_t stream);
// dlogits += scale * 2 * lse * softmax(logits) / n.
void router_z_loss_backward(const float* logits, float scale, float* dlogits, int64_t n,
                            int64_t num_experts, cudaStream_t stream);

}  // namespace switchyard::cuda
