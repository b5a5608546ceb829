// Router statistics for the load-balancing aux loss, and its gradient.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// probs: (n, E), expert_ids: (n, k) -> selections: (E) number of top-k selections per
// expert, prob_sums: (E) column sums of probs (both f32, written; summed in double).
void routing_counts(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                    Tensor& selections, Tensor& prob_sums);

// dlogits[t] += softmax backward of a per-expert probability gradient shared by every
// row: dlogits[t, e] += p[t, e] * (g[e] - sum_j p[t, j] g[j]). probs: (n, E), g: (E).
void aux_loss_backward(Device& dev, const Tensor& probs, const Tensor& prob_grad, Tensor& dlogits);

}  // namespace switchyard
