// CPU router gating kernels: softmax over experts, top-k, optional renormalisation,
// the sigmoid router, expert choice, their backward, round-robin routing, and the router
// z-loss.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/top_k_selection.h"

namespace switchyard::cpu {

template <typename T> T row_max(const T* x, int64_t count) {
  T max = x[0];
  for (int64_t i = 1; i < count; ++i) max = std::max(max, x[i]);
  return max;
}

// Softmax of one row of `count` values into out, shifted by the row max so exp
// cannot overflow.
template <typename T> void softmax_row(const T* logits, T* out, int64_t count) {
  const T max = row_max(logits, count);
  T sum = T(0);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = std::exp(logits[i] - max);
    sum += out[i];
  }
  for (int64_t i = 0; i < count; ++i) out[i] /= sum;
}

template <typename T> T logsumexp_row(const T* x, int64_t count) {
  const T max = row_max(x, count);
  T sum = T(0);
  for (int64_t i = 0; i < count; ++i) sum += std::exp(x[i] - max);
  return max + std::log(sum);
}

// logits: (n, E) -> probs: (n, E), expert_ids: (n, k) by rank, weights: (n, k).
template <typename T>
void gating_forward(const T* logits, T* probs, int32_t* expert_ids, T* weights, int64_t n,
                    int64_t num_experts, int k, bool renormalize) {
#pragma omp parallel for schedule(static) if (n * num_experts * k >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    T* p = probs + r * num_experts;
    int32_t* ids = expert_ids + r * k;
    T* w = weights + r * k;
    softmax_row(logits + r * num_experts, p, num_experts);
    select_top_k(p, num_experts, k, renormalize, ids, w);
  }
}

// dweights: (n, k) -> dlogits: (n, E) written. The selection is held fixed; with
// renormalisation w_j = p_j / S, so dp_i = (dw_i - sum_j dw_j w_j) / S on the selected
// experts and 0 elsewhere, then dlogit = p * (dp - sum(p * dp)). An expert id of -1 (no
// expert) is a slot that selects nothing: it is skipped, as if the row had one fewer.
template <typename T>
void gating_backward(const T* probs, const int32_t* expert_ids, const T* dweights, T* dlogits,
                     int64_t n, int64_t num_experts, int k, bool renormalize) {
#pragma omp parallel for schedule(static) if (n * num_experts >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* p = probs + r * num_experts;
    const int32_t* ids = expert_ids + r * k;
    const T* dw = dweights + r * k;
    T* dl = dlogits + r * num_experts;
    T sum_p = T(0);
    T sum_dw_p = T(0);
    for (int j = 0; j < k; ++j) {
      if (ids[j] < 0) continue;
      sum_p += p[ids[j]];
      sum_dw_p += dw[j] * p[ids[j]];
    }
    // dp_j = a * dw_j + b on the selected experts.
    const T a = renormalize ? T(1) / sum_p : T(1);
    const T b = renormalize ? -sum_dw_p / (sum_p * sum_p) : T(0);
    T p_dot_dp = T(0);
    for (int j = 0; j < k; ++j)
      if (ids[j] >= 0) p_dot_dp += p[ids[j]] * (a * dw[j] + b);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] = -p[e] * p_dot_dp;
    for (int j = 0; j < k; ++j)
      if (ids[j] >= 0) dl[ids[j]] = p[ids[j]] * (a * dw[j] + b - p_dot_dp);
  }
}

// The sigmoid router: logits (n, E) -> scores (n, E) = sigmoid(logits), expert_ids and
// weights (n, k) by select_sigmoid_top_k with the experts' bias (E).
template <typename T>
void sigmoid_gating_forward(const T* logits, const float* bias, T* scores, int32_t* expert_ids,
                            T* weights, int64_t n, int64_t num_experts, const SigmoidGating& g) {
#pragma omp parallel for schedule(static) if (n * num_experts * g.k >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* l = logits + r * num_experts;
    T* s = scores + r * num_experts;
    for (int64_t e = 0; e < num_experts; ++e) s[e] = T(1) / (T(1) + std::exp(-l[e]));
    select_sigmoid_top_k(s, bias, num_experts, g, expert_ids + r * g.k, weights + r * g.k);
  }
}

// dweights: (n, k) -> dlogits: (n, E) written, the selection held fixed. With
// w_j = c s_j / (S + eps), S the sum of the chosen scores, ds_i = c (dw_i - sum_j dw_j
// s_j / (S + eps)) / (S + eps) (renormalised) or c dw_i; then dlogit = ds s (1 - s). An
// expert id of -1 (no expert) is skipped, as in gating_backward.
template <typename T>
void sigmoid_gating_backward(const T* scores, const int32_t* expert_ids, const T* dweights,
                             T* dlogits, int64_t n, int64_t num_experts, const SigmoidGating& g) {
#pragma omp parallel for schedule(static) if (n * num_experts >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* s = scores + r * num_experts;
    const int32_t* ids = expert_ids + r * g.k;
    const T* dw = dweights + r * g.k;
    T* dl = dlogits + r * num_experts;
    T total = T(0), dw_dot_s = T(0);
    for (int j = 0; j < g.k; ++j) {
      if (ids[j] < 0) continue;
      total += s[ids[j]];
      dw_dot_s += dw[j] * s[ids[j]];
    }
    const T denominator = total + static_cast<T>(1e-20);
    const T c = static_cast<T>(g.scaling);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] = T(0);
    for (int j = 0; j < g.k; ++j) {
      if (ids[j] < 0) continue;
      const T ds = g.renormalize ? c * (dw[j] - dw_dot_s / denominator) / denominator : c * dw[j];
      const T si = s[ids[j]];
      dl[ids[j]] = ds * si * (T(1) - si);
    }
  }
}

// moe.router_force_balance: token t (of the group, first_token + t) goes to experts
// (t k + j) mod E, j < k, each with weight 1 / k.
template <typename T>
void round_robin_routing(int64_t first_token, int32_t* expert_ids, T* weights, int64_t n,
                         int64_t num_experts, int k) {
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      expert_ids[t * k + j] = static_cast<int32_t>(((first_token + t) * k + j) % num_experts);
      weights[t * k + j] = T(1) / static_cast<T>(k);
    }
}

// Expert choice: probs (n, E) -> expert_ids (n, E) = e where expert e takes token t
// (expert_takes_token), else -1; weights (n, E) = the probability there, else 0.
template <typename T>
void expert_choice_forward(const T* probs, int32_t* expert_ids, T* weights, int64_t n,
                           int64_t num_experts, int64_t capacity) {
#pragma omp parallel for schedule(static) if (n * num_experts * capacity >= kParallelMinWork)
  for (int64_t a = 0; a < n * num_experts; ++a) {
    const int64_t t = a / num_experts, e = a % num_experts;
    const bool taken = expert_takes_token(probs, n, num_experts, capacity, t, e);
    expert_ids[a] = taken ? static_cast<int32_t>(e) : -1;
    weights[a] = taken ? probs[a] : T(0);
  }
}

// dweights: (n, E) -> dlogits: (n, E) written: the softmax backward of the taken
// probabilities (an expert that did not take the token gives it no weight to move).
template <typename T>
void expert_choice_backward(const T* probs, const int32_t* expert_ids, const T* dweights,
                            T* dlogits, int64_t n, int64_t num_experts) {
#pragma omp parallel for schedule(static) if (n * num_experts >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    const T* p = probs + t * num_experts;
    const int32_t* ids = expert_ids + t * num_experts;
    const T* dw = dweights + t * num_experts;
    T* dl = dlogits + t * num_experts;
    T p_dot_dp = T(0);
    for (int64_t e = 0; e < num_experts; ++e) p_dot_dp += ids[e] >= 0 ? p[e] * dw[e] : T(0);
    for (int64_t e = 0; e < num_experts; ++e)
      dl[e] = p[e] * ((ids[e] >= 0 ? dw[e] : T(0)) - p_dot_dp);
  }
}

// Sum over the n rows of logsumexp(logits row)^2, in a fixed order.
template <typename T>
double router_z_loss_sum(const T* logits, int64_t n, int64_t num_experts) {
  if (n == 0) return 0.0;
  return ordered_chunk_sum(n, num_experts, [&](int64_t r) {
    const double lse = static_cast<double>(logsumexp_row(logits + r * num_experts, num_experts));
    return lse * lse;
  });
}

// Mean over the n rows of logsumexp(logits row)^2.
template <typename T>
double router_z_loss_forward(const T* logits, int64_t n, int64_t num_experts) {
  return n == 0 ? 0.0 : router_z_loss_sum(logits, n, num_experts) / static_cast<double>(n);
}

// dlogits += scale * 2 * lse * softmax(logits) / n.
template <typename T>
void router_z_loss_backward(const T* logits, T scale, T* dlogits, int64_t n, int64_t num_experts) {
#pragma omp parallel for schedule(static) if (n * num_experts >= kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    const T* row = logits + r * num_experts;
    T* dl = dlogits + r * num_experts;
    const T lse = logsumexp_row(row, num_experts);
    const T coeff = scale * T(2) * lse / static_cast<T>(n);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] += coeff * std::exp(row[e] - lse);
  }
}

}  // namespace switchyard::cpu
