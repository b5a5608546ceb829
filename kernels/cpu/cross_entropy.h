// CPU softmax cross-entropy over the vocabulary. Rows are shifted by their maximum
// before exponentiating, so logits of any size stay finite.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// logits: (n, vocab), targets: (n) (negative: ignored) -> losses: (n), lse: (n).
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab,
                           T* losses, T* lse) {
#pragma omp parallel for schedule(static) if (n * vocab >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* x = logits + r * vocab;
    T max = x[0];
#pragma omp simd reduction(max : max)
    for (int64_t j = 1; j < vocab; ++j) max = x[j] > max ? x[j] : max;
    T sum = T(0);
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[j] - max);
    lse[r] = max + std::log(sum);
    losses[r] = targets[r] < 0 ? T(0) : lse[r] - x[targets[r]];
  }
}

// dlogits = scale * (softmax(logits) - onehot(target)), written; ignored rows get 0.
// Each element is read before it is written, so dlogits may alias logits.
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, T scale,
                            int64_t n, int64_t vocab, T* dlogits) {
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
    d[targets[r]] -= scale;
  }
}

}  // namespace switchyard::cpu
