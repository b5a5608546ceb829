// CUDA router gating kernels (twins of kernels/cpu/gating.h): softmax over experts,
// top-k, optional renormalisation, their backward, and the router z-loss. The router
// runs in fp32, so these are not templates. One thread per token row: router rows are
// short (E experts), and the selection follows the CPU kernel step by step, ties and
// NaNs included.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// logits: (n, E) -> probs: (n, E), expert_ids: (n, k) by rank, weights: (n, k).
void gating_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                    int64_t n, int64_t num_experts, int k, bool renormalize, cudaStream_t stream);
// gating_forward, routing_counts (kernels/cuda/router_aux.h) and the router z-loss in
// one pass over the logits: also writes selections: (E) top-k selections per expert and
// prob_sums: (E) column sums of probs, and returns the z-loss (blocks until it is on the
// host). For num_experts <= kFusedRouterMaxExperts.
inline constexpr int64_t kFusedRouterMaxExperts = 2048;
double router_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                      float* selections, float* prob_sums, int64_t n, int64_t num_experts, int k,
                      bool renormalize, cudaStream_t stream);
// dweights: (n, k) -> dlogits: (n, E) written, the selection held fixed.
void gating_backward(const float* probs, const int32_t* expert_ids, const float* dweights,
                     float* dlogits, int64_t n, int64_t num_experts, int k, bool renormalize,
                     cudaStream_t stream);
// Mean over the n rows of logsumexp(row)^2, summed in double in a fixed order; blocks
// until the value is on the host.
double router_z_loss_forward(const float* logits, int64_t n, int64_t num_experts,
                             cudaStream_t stream);
// dlogits += scale * 2 * lse * softmax(logits) / n.
void router_z_loss_backward(const float* logits, float scale, float* dlogits, int64_t n,
                            int64_t num_experts, cudaStream_t stream);

}  // namespace switchyard::cuda
