// The router's top-k selection, one definition for the CPU and CUDA kernels (host and
// device code): experts ranked by a score, ties to the lower id; the sigmoid router's
// group-limited choice (DeepSeek-V3); and expert choice's ranking of tokens.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/runtime/host_device.h"

namespace switchyard {

// Whether expert a (prob pa) ranks before expert b (prob pb): higher probability
// first, lower id on ties. A NaN compares as a tie, so an all-NaN row (diverged
// logits) still yields k distinct, valid ids.
template <typename T>
SY_HOST_DEVICE bool ranks_before(T pa, int64_t a, T pb, int64_t b) {
  return pa > pb || (!(pa < pb) && a < b);
}

// The ids of the k best of `count` candidates by key(i), in rank order. k selection
// passes, each taking the best candidate ranked after the previous pick: no scratch,
// cheap for the small k of MoE routers.
template <typename Key>
SY_HOST_DEVICE void select_top_k_ids(const Key& key, int64_t count, int k, int32_t* ids) {
  int64_t prev = -1;
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < count; ++e) {
      if (prev >= 0 && !ranks_before(key(prev), prev, key(e), e)) continue;
      if (best < 0 || ranks_before(key(e), e, key(best), best)) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    prev = best;
  }
}

template <typename T>
struct ValueKey {
  const T* values;
  SY_HOST_DEVICE T operator()(int64_t e) const { return values[e]; }
};

// The k best of one row's probabilities p (num_experts of them) into ids and w, in
// rank order; w divided by its sum when `renormalize`.
template <typename T>
SY_HOST_DEVICE void select_top_k(const T* p, int64_t num_experts, int k, bool renormalize,
                                 int32_t* ids, T* w) {
  select_top_k_ids(ValueKey<T>{p}, num_experts, k, ids);
  T total = T(0);
  for (int j = 0; j < k; ++j) {
    w[j] = p[ids[j]];
    total += w[j];
  }
  if (renormalize)
    for (int j = 0; j < k; ++j) w[j] /= total;
}

// The sigmoid router (moe.score_function SIGMOID): experts are chosen by score + bias, in
// the best `top_groups` of `num_groups` groups of consecutive experts; the gate weights
// are the chosen scores alone, divided by their sum when `renormalize`, times `scaling`.
struct SigmoidGating {
  int k = 1;
  bool renormalize = false;
  float scaling = 1.0f;
  int num_groups = 1;  // at most kMaxExpertGroups
  int top_groups = 1;
};
inline constexpr int kMaxExpertGroups = 64;

// What the sigmoid router ranks experts by: score + bias inside the allowed groups (a
// bit per group), -infinity outside them.
template <typename T>
struct BiasedChoice {
  const T* scores;
  const float* bias;
  uint64_t allowed_groups;
  int64_t group_size;
  SY_HOST_DEVICE T operator()(int64_t e) const {
    if (!((allowed_groups >> (e / group_size)) & 1)) return -static_cast<T>(INFINITY);
    return scores[e] + static_cast<T>(bias[e]);
  }
};

// A group's rank: the sum of its best two (fewer when it has fewer experts) biased scores.
template <typename T>
SY_HOST_DEVICE T group_score(const T* scores, const float* bias, int64_t first, int64_t size) {
  const BiasedChoice<T> choice{scores + first, bias + first, ~uint64_t{0}, size};
  int32_t best[2] = {0, 0};
  const int take = size < 2 ? static_cast<int>(size) : 2;
  select_top_k_ids(choice, size, take, best);
  T sum = T(0);
  for (int j = 0; j < take; ++j) sum += choice(best[j]);
  return sum;
}

template <typename T>
struct GroupScoreKey {
  const T* scores;
  const float* bias;
  int64_t group_size;
  SY_HOST_DEVICE T operator()(int64_t g) const {
    return group_score(scores, bias, g * group_size, group_size);
  }
};

// One token's sigmoid routing from its scores (num_experts sigmoids) and the experts'
// bias: ids and w (k each) in rank order of score + bias.
template <typename T>
SY_HOST_DEVICE void select_sigmoid_top_k(const T* scores, const float* bias, int64_t num_experts,
                                         const SigmoidGating& g, int32_t* ids, T* w) {
  const int64_t group_size = num_experts / g.num_groups;
  uint64_t allowed = ~uint64_t{0};
  if (g.top_groups < g.num_groups) {
    int32_t groups[kMaxExpertGroups];
    select_top_k_ids(GroupScoreKey<T>{scores, bias, group_size}, g.num_groups, g.top_groups,
                     groups);
    allowed = 0;
    for (int j = 0; j < g.top_groups; ++j) allowed |= uint64_t{1} << groups[j];
  }
  select_top_k_ids(BiasedChoice<T>{scores, bias, allowed, group_size}, num_experts, g.k, ids);
  T total = T(0);
  for (int j = 0; j < g.k; ++j) {
    w[j] = scores[ids[j]];
    total += w[j];
  }
  // transformers' DeepSeek-V3 router adds 1e-20 to the sum, which keeps a row whose
  // scores all underflowed finite.
  const T scale = g.renormalize ? static_cast<T>(g.scaling) / (total + static_cast<T>(1e-20))
                                : static_cast<T>(g.scaling);
  for (int j = 0; j < g.k; ++j) w[j] *= scale;
}

// Expert choice (moe.gating EXPERT_CHOICE): token t's rank among the n tokens for expert
// e, by probability (probs (n, E)), ties to the lower token; the expert takes the tokens
// of rank < capacity. Counting stops at the capacity, so a call costs O(n).
template <typename T>
SY_HOST_DEVICE bool expert_takes_token(const T* probs, int64_t n, int64_t num_experts,
                                       int64_t capacity, int64_t t, int64_t e) {
  const T pt = probs[t * num_experts + e];
  int64_t rank = 0;
  for (int64_t u = 0; u < n && rank < capacity; ++u)
    rank += u != t && ranks_before(probs[u * num_experts + e], u, pt, t);
  return rank < capacity;
}

}  // namespace switchyard
