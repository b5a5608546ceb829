// Softmax cross-entropy over the vocabulary.
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// logits: (n, vocab), targets: (n) i32 (a negative target is ignored: loss 0, no
// gradient) -> losses: (n) per-row loss, lse: (n) log-sum-exp saved for backward.
void cross_entropy_forward(Device& dev, const Tensor& logits, const Tensor& targets,
                           Tensor& losses, Tensor& lse);
// dlogits = scale * (softmax(logits) - onehot(target)), written; may alias logits.
void cross_entropy_backward(Device& dev, const Tensor& logits, const Tensor& targets,
                            const Tensor& lse, float scale, Tensor& dlogits);

}  // namespace switchyard
