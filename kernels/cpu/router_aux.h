#pragma once

#include <cstdint>
#include <vector>

namespace switchyard::cpu {

template <typename T>
void routing_counts(const T* probs, const int32_t* expert_ids, int64_t n, int64_t experts,
                    int64_t k, T* selections, T* prob_sums) {
  std::vector<double> sel(experts, 0.0), psum(experts, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = expert_ids[t * k + j];
      if (e >= 0) sel[e] += 1.0;
    }
    for (int64_t e = 0; e < experts; ++e) psum[e] += probs[t * experts + e];
  }
  for (int64_t e = 0; e < experts; ++e) {
    selections[e] = static_cast<T>(sel[e]);
    prob_sums[e] = static_cast<T>(psum[e]);
  }
}

template <typename T>
void aux_loss_backward(const T* probs, const T* prob_grad, int64_t n, int64_t experts,
                       T* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const T* p = probs + t * experts;
    T dot = 0;
    for (int64_t e = 0; e < experts; ++e) dot += p[e] * prob_grad[e];
    for (int64_t e = 0; e < experts; ++e) dlogits[t * experts + e] += p[e] * (prob_grad[e] - dot);
  }
}

}  // namespace switchyard::cpu
