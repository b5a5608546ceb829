// CUDA router statistics for the load-balancing aux loss, and its gradient (twins of
// kernels/cpu/router_aux.h). fp32, like the router.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// probs: (n, E), expert_ids: (n, k) (-1 = not sent) -> selections: (E) top-k selections
// per expert, prob_sums: (E) column sums of probs, both written; one block per expert,
// summed in double in a fixed order.
void routing_counts(const float* probs, const int32_t* expert_ids, int64_t n, int64_t experts,
                    int64_t k, float* selections, float* prob_sums, cudaStream_t stream);
// dlogits[t, e] += p[t, e] * (g[e] - sum_j p[t, j] g[j]); probs: (n, E), g: (E).
void aux_loss_backward(const float* probs, const float* prob_grad, int64_t n, int64_t experts,
                       float* dlogits, cudaStream_t stream);

}  // namespace switchyard::cuda
