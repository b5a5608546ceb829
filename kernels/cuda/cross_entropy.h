// CUDA softmax cross-entropy over the vocabulary (twins of kernels/cpu/cross_entropy.h).
// The loss runs in fp32: logits, lse and losses are float; only the backward's gradient
// is a template on its element type, float or __nv_bfloat16 (the bf16 gradient feeds the
// LM head's bf16 GEMMs), computed in float and rounded once. One block per row: the
// forward reads the row once, keeping a running (max, sum of exp) per thread that a
// fixed-order block reduction merges, so no probabilities are materialised and the bits
// depend only on the block size. A negative target is ignored (loss 0, no gradient).
// Targets are checked on the device: one at or past the whole vocabulary stops the
// kernel, and the next checked CUDA call aborts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// logits: (n, vocab), targets: (n) -> losses: (n), lse: (n).
void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                           float* losses, float* lse, cudaStream_t stream);
// dlogits = scale * (softmax(logits) - onehot(target)), written; ignored rows get 0. The
// logits are columns [vocab_start, vocab_start + vocab) of a vocabulary of `whole` tokens
// and lse the log-sum-exp over all of it. Each element is read before it is written by
// the same thread, so a float dlogits may alias logits (a bf16 one is a separate buffer).
template <typename T>
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                            float scale, int64_t n, int64_t vocab, int64_t vocab_start,
                            int64_t whole, T* dlogits, cudaStream_t stream);
// One vocabulary shard's log-sum-exp per row, and the target's logit where the target
// (a whole-vocabulary id) falls in columns [vocab_start, vocab_start + vocab), else 0.
void cross_entropy_shard_forward(const float* logits, const int32_t* targets, int64_t n,
                                 int64_t vocab, int64_t vocab_start, int64_t whole, float* lse,
                                 float* target_logits, cudaStream_t stream);

}  // namespace switchyard::cuda
