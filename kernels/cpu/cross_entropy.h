// CPU softmax cross-entropy over the vocabulary. Rows are shifted by their maximum
// before exponentiating, so logits of any size stay finite.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// log(sum_j exp(x[j])) of one row, shifted by the row's maximum.
template <typename T>
T row_logsumexp(const T* x, int64_t vocab) {
  T max = x[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 1; j < vocab; ++j) max = x[j] > max ? x[j] : max;
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[j] - max);
  return max + std::log(sum);
}

// logits: (n, vocab), targets: (n) (negative: ignored) -> losses: (n), lse: (n).
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                           T* losses, T* lse) {
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* x = logits + r * vocab;
    lse[r] = row_logsumexp(x, vocab);
    losses[r] = targets[r] < 0 ? T(0) : lse[r] - x[targets[r]];
  }
}

// dlogits = scale * (softmax(logits) - onehot(target)), written; ignored rows get 0.
// The logits are columns [vocab_start, vocab_start + vocab) of the vocabulary and lse
// the log-sum-exp over all of it. Each element is read before it is written, so
// dlogits may alias logits.
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, T scale,
                            int64_t n, int64_t vocab, int64_t vocab_start, T* dlogits) {
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* x = logits + r * vocab;
    T* d = dlogits + r * vocab;
    if (targets[r] < 0) {
      for (int64_t j = 0; j < vocab; ++j) d[j] = T(0);
      continue;
    }
    const T shift = lse[r];
    for (int64_t j = 0; j < vocab; ++j) d[j] = scale * std::exp(x[j] - shift);
    const int64_t target = targets[r] - vocab_start;
    if (target >= 0 && target < vocab) d[target] -= scale;
  }
}

// One vocabulary shard's log-sum-exp per row, and the target's logit where the target
// (a whole-vocabulary id) falls in columns [vocab_start, vocab_start + vocab), else 0.
template <typename T>
void cross_entropy_shard_forward(const T* logits, const int32_t* targets, int64_t n,
                                 int64_t vocab, int64_t vocab_start, T* lse, T* target_logits) {
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* x = logits + r * vocab;
    lse[r] = row_logsumexp(x, vocab);
    const int64_t target = targets[r] - vocab_start;
    target_logits[r] = targets[r] >= 0 && target >= 0 && target < vocab ? x[target] : T(0);
  }
}

}  // namespace switchyard::cpu
