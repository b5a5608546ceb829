// Softmax cross-entropy over the vocabulary.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// The columns a vocabulary-parallel rank holds: [start, start + logits.dim(1)) of a
// vocabulary of `whole` tokens (0: the logits hold the whole vocabulary).
struct VocabShard {
  int64_t start = 0;
  int64_t whole = 0;
};

// logits: (n, vocab) f32, targets: (n) i32 (a negative target is ignored: loss 0, no
// gradient) -> losses: (n) per-row loss, lse: (n) log-sum-exp saved for backward, f32.
void cross_entropy_forward(Device& dev, const Tensor& logits, const Tensor& targets, Tensor& losses,
                           Tensor& lse);
// dlogits = scale * (softmax(logits) - onehot(target)), written. logits and lse are f32;
// dlogits is f32 (and may alias logits) or bf16, a separate tensor that gets the f32
// gradient rounded once (it feeds the LM head's bf16 GEMMs).
// For a vocabulary shard, lse is the log-sum-exp over the whole vocabulary and the
// one-hot term applies where the target falls in the shard.
void cross_entropy_backward(Device& dev, const Tensor& logits, const Tensor& targets,
                            const Tensor& lse, float scale, Tensor& dlogits, VocabShard shard = {});

// The per-shard half of a vocabulary-parallel forward (f32 throughout): lse: (n)
// log-sum-exp over this shard's columns; target_logits: (n) the target's logit where the
// target falls in the shard, else 0. Combining the shards' values gives
// cross_entropy_forward's.
void cross_entropy_shard_forward(Device& dev, const Tensor& logits, const Tensor& targets,
                                 VocabShard shard, Tensor& lse, Tensor& target_logits);

}  // namespace switchyard
