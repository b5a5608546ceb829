#pragma once

#include <cstdint>
#include <vector>

namespace switchyard::cpu {

// The token's normalised-score divisor: its score sum (sigmoid), or 1 (probabilities).
template <typename T>
double score_total(const T* p, int64_t experts, bool normalize) {
  if (!normalize) return 1.0;
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += p[e];
  return total;
}

template <typename T>
void sequence_routing_sums(const T* probs, const int32_t* expert_ids, int64_t n, int64_t experts,
                           int64_t k, bool normalize, int64_t first_token, int64_t seq_len,
                           int64_t sequences, T* sums) {
  std::vector<double> acc(sequences * 2 * experts, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    double* row = acc.data() + (first_token + t) / seq_len * 2 * experts;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = expert_ids[t * k + j];
      if (e >= 0) row[e] += 1.0;
    }
    const T* p = probs + t * experts;
    const double total = score_total(p, experts, normalize);
    for (int64_t e = 0; e < experts; ++e) row[experts + e] += p[e] / total;
  }
  for (size_t i = 0; i < acc.size(); ++i) sums[i] = static_cast<T>(acc[i]);
}

template <typename T>
void sequence_aux_backward(const T* probs, const T* sums, int64_t n, int64_t experts,
                           bool normalize, int64_t first_token, int64_t seq_len, T scale,
                           T* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const T* selections = sums + (first_token + t) / seq_len * 2 * experts;
    const T* p = probs + t * experts;
    const T total = static_cast<T>(score_total(p, experts, normalize));
    T dot = 0;
    for (int64_t e = 0; e < experts; ++e) dot += p[e] / total * scale * selections[e];
    for (int64_t e = 0; e < experts; ++e) {
      const T slope = normalize ? p[e] * (1 - p[e]) / total : p[e];
      dlogits[t * experts + e] += slope * (scale * selections[e] - dot);
    }
  }
}

}  // namespace switchyard::cpu
