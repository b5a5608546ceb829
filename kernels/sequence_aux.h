// The sequence-wise auxiliary loss's routing sums and gradient (moe.seq_aux_loss_coef).
// A rank's router rows are tokens first_token, first_token + 1, ... of a batch cut into
// sequences of seq_len tokens; the sums hold one (2E) row per sequence: the sequence's
// top-k selections of each expert, then the sum over its tokens of each expert's
// normalised score q[t, e]: the probability itself for softmax gatings (normalize
// false), the sigmoid score divided by the token's score sum for sigmoid gating (true).
#pragma once

#include <cstdint>

#include "core/runtime/tensor.h"

namespace switchyard {

struct SequenceRows {
  int64_t first_token = 0;  // the batch index of the first row
  int64_t seq_len = 0;      // tokens per sequence
};

// probs: (n, E), expert_ids: (n, k) (-1: no expert) -> sums: (sequences, 2E) f32,
// written (zero for sequences without rows here; summed in double).
void sequence_routing_sums(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                           bool normalize, SequenceRows rows, Tensor& sums);

// dlogits[t] += the gradient of sum_e g[e] q[t, e] with g = scale * (the selections of
// t's sequence in `sums`): p (g - p.g) for softmax probabilities, and for sigmoid
// scores s with sum S, s_e (1 - s_e) / S (g_e - q.g).
void sequence_aux_backward(Device& dev, const Tensor& probs, const Tensor& sums, bool normalize,
                           SequenceRows rows, float scale, Tensor& dlogits);

}  // namespace switchyard
