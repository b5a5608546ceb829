// Expert capacity: the one definition of how many assignments an expert keeps at a
// capacity factor, used by the MoE layers, the balance statistics and the memory planner.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace switchyard {

// ceil(cf x tokens x top_k / E) for `tokens` routed tokens, computed in f32 (the recipe's
// type for the factor) so every user rounds the same factor the same way.
inline int64_t expert_capacity(float capacity_factor, int64_t tokens, int top_k, int num_experts) {
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<float>(tokens) * static_cast<float>(top_k) /
                static_cast<float>(num_experts)));
}

// Expert choice's tokens per expert: the capacity at factor cf (0 reads as 1), at least
// one and at most every token.
inline int64_t expert_choice_capacity(float capacity_factor, int64_t tokens, int top_k,
                                      int num_experts) {
  return std::clamp<int64_t>(
      expert_capacity(capacity_factor > 0 ? capacity_factor : 1.0f, tokens, top_k, num_experts), 1,
      std::max<int64_t>(tokens, 1));
}

}  // namespace switchyard
