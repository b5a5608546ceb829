// CPU token permutation kernels: the dispatch plan (counting sort by expert with an
// optional capacity), the gather into expert order and the weighted combine back.
// Assignment a = t * k + j is token t's j-th routed expert.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// expert_ids: (n, k), each in [0, num_experts) or -1 for "not sent"; weights: (n, k), read only when
// capacity >= 0. Writes tokens_per_expert: (num_experts) kept counts and dest_rows:
// (n, k), -1 for dropped assignments; each expert's block holds its rows in token order.
template <typename T>
void permute_plan(const int32_t* expert_ids, const T* weights, int64_t n, int k, int num_experts,
                  int64_t capacity, int32_t* tokens_per_expert, int32_t* dest_rows) {
  const int64_t total = n * k;
  std::vector<int64_t> count(static_cast<size_t>(num_experts), 0);
  for (int64_t a = 0; a < total; ++a)
    if (expert_ids[a] >= 0) ++count[expert_ids[a]];

  std::vector<uint8_t> kept(static_cast<size_t>(total), 1);
  if (capacity >= 0) {
    // Counting sort of the assignments by expert, stable in assignment order.
    std::vector<int64_t> begin(static_cast<size_t>(num_experts) + 1, 0);
    for (int e = 0; e < num_experts; ++e) begin[e + 1] = begin[e] + count[e];
    std::vector<int64_t> cursor(begin.begin(), begin.end() - 1);
    std::vector<int64_t> order(static_cast<size_t>(begin[num_experts]));
    for (int64_t a = 0; a < total; ++a)
      if (expert_ids[a] >= 0) order[cursor[expert_ids[a]]++] = a;

    // NaN weights rank last so the ordering stays strict and weak.
    auto key = [weights](int64_t a) {
      const T w = weights[a];
      return std::isnan(w) ? -std::numeric_limits<T>::infinity() : w;
    };
    auto keeps_before = [&key](int64_t a, int64_t b) {
      const T ka = key(a);
      const T kb = key(b);
      return ka > kb || (ka == kb && a < b);
    };
    for (int e = 0; e < num_experts; ++e) {
      if (count[e] <= capacity) continue;
      const auto first = order.begin() + begin[e];
      const auto last = order.begin() + begin[e + 1];
      std::nth_element(first, first + capacity, last, keeps_before);
      for (auto it = first + capacity; it != last; ++it) kept[*it] = 0;
      count[e] = capacity;
    }
  }

  std::vector<int64_t> next_row(static_cast<size_t>(num_experts), 0);
  for (int e = 1; e < num_experts; ++e) next_row[e] = next_row[e - 1] + count[e - 1];
  for (int64_t a = 0; a < total; ++a) {
    dest_rows[a] = kept[a] && expert_ids[a] >= 0 ? static_cast<int32_t>(next_row[expert_ids[a]]++) : -1;
  }
  for (int e = 0; e < num_experts; ++e) tokens_per_expert[e] = static_cast<int32_t>(count[e]);
}

// xp[dest_rows[t, j]] = x[t] for every kept assignment; x: (n, hidden).
template <typename T>
void permute_gather(const T* x, const int32_t* dest_rows, T* xp, int64_t n, int k, int64_t hidden) {
#pragma omp parallel for schedule(static) if (n * k * hidden >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    const T* xt = x + t * hidden;
    for (int j = 0; j < k; ++j) {
      const int32_t row = dest_rows[t * k + j];
      if (row >= 0) std::copy(xt, xt + hidden, xp + row * hidden);
    }
  }
}

// dx[t] += sum over kept j of dxp[dest_rows[t, j]], in j order.
template <typename T>
void permute_gather_backward(const T* dxp, const int32_t* dest_rows, T* dx, int64_t n, int k,
                             int64_t hidden) {
#pragma omp parallel for schedule(static) if (n * k * hidden >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    T* dxt = dx + t * hidden;
    for (int j = 0; j < k; ++j) {
      const int32_t row = dest_rows[t * k + j];
      if (row < 0) continue;
      const T* src = dxp + row * hidden;
      for (int64_t i = 0; i < hidden; ++i) dxt[i] += src[i];
    }
  }
}

// y[t] = sum over kept j of weights[t, j] * yp[dest_rows[t, j]], in j order (written).
template <typename T>
void unpermute_combine(const T* yp, const int32_t* dest_rows, const T* weights, T* y, int64_t n,
                       int k, int64_t hidden) {
#pragma omp parallel for schedule(static) if (n * k * hidden >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    T* yt = y + t * hidden;
    std::fill(yt, yt + hidden, T(0));
    for (int j = 0; j < k; ++j) {
      const int32_t row = dest_rows[t * k + j];
      if (row < 0) continue;
      const T w = weights[t * k + j];
      const T* src = yp + row * hidden;
      for (int64_t i = 0; i < hidden; ++i) yt[i] += w * src[i];
    }
  }
}

// dyp: (permuted_rows, hidden) written, zero on rows no assignment maps to;
// dweights[t, j] = dot(dy[t], yp[dest_rows[t, j]]), 0 when dropped.
template <typename T>
void unpermute_combine_backward(const T* dy, const T* yp, const int32_t* dest_rows,
                                const T* weights, T* dyp, T* dweights, int64_t n, int k,
                                int64_t hidden, int64_t permuted_rows) {
  std::fill(dyp, dyp + permuted_rows * hidden, T(0));
#pragma omp parallel for schedule(static) if (n * k * hidden >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    const T* dyt = dy + t * hidden;
    for (int j = 0; j < k; ++j) {
      const int64_t a = t * k + j;
      const int32_t row = dest_rows[a];
      if (row < 0) {
        dweights[a] = T(0);
        continue;
      }
      const T w = weights[a];
      const T* src = yp + row * hidden;
      T* dst = dyp + row * hidden;
      T dot = T(0);
      for (int64_t i = 0; i < hidden; ++i) {
        dst[i] = w * dyt[i];
        dot += dyt[i] * src[i];
      }
      dweights[a] = dot;
    }
  }
}

}  // namespace switchyard::cpu
