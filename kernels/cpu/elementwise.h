// CPU elementwise and reduction kernels, templates on the element type so tests can
// run them in double. The shared helpers (parallel threshold, ordered chunked sums)
// live here for the other CPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace switchyard::cpu {

// Below this much work an OpenMP team costs more than it saves.
inline constexpr int64_t kParallelMinWork = 1 << 15;

// Sum of term(i) for i in [0, n), in double. The partial sums are over fixed chunks
// and added in chunk order, so the result does not depend on the thread count.
template <typename Term> double ordered_chunk_sum(int64_t n, int64_t work_per_item, Term term) {
  constexpr int64_t kChunk = 1024;
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(num_chunks), 0.0);
#pragma omp parallel for schedule(static) if (n * work_per_item >= kParallelMinWork)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) s += term(i);
    partial[c] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

// y += alpha * x over n elements.
template <typename T> void add(T* y, const T* x, T alpha, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// x *= alpha over n elements.
template <typename T> void scale(T* x, T alpha, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

// y: (rows, n) += bias: (n) on every row.
template <typename T> void add_bias(T* y, const T* bias, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    T* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] += bias[i];
  }
}

// dbias: (n) += column sums of dy: (rows, n). Threads own disjoint column blocks and
// each sums its rows in order, which keeps the result deterministic. The sums run in
// double: an f32 running sum of many rows drifts (by 1.8e-4 of the result over 70,000
// bf16 rows), where the GPU's blocked sum does not.
template <typename T> void bias_backward(const T* dy, T* dbias, int64_t rows, int64_t n) {
  constexpr int64_t kBlock = 64;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t width = std::min(kBlock, n - begin);
    double acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* dyr = dy + r * n + begin;
      for (int64_t i = 0; i < width; ++i) acc[i] += dyr[i];
    }
    for (int64_t i = 0; i < width; ++i) dbias[begin + i] += static_cast<T>(acc[i]);
  }
}

template <typename T> double sum_squares(const T* x, int64_t n) {
  return ordered_chunk_sum(n, 1, [x](int64_t i) {
    const double v = static_cast<double>(x[i]);
    return v * v;
  });
}

// y[r] += sigmoid(g[r]) * x[r]; x, y: (rows, n), g: (rows).
template <typename T>
void sigmoid_gate_forward(const T* x, const T* g, T* y, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T s = sigmoid(g[r]);
    const T* xr = x + r * n;
    T* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] += s * xr[i];
  }
}

// dx[r] = sigmoid(g[r]) * dy[r]; dg[r] = s (1 - s) dot(dy[r], x[r]) (both written).
template <typename T>
void sigmoid_gate_backward(const T* dy, const T* x, const T* g, T* dx, T* dg, int64_t rows,
                           int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T s = sigmoid(g[r]);
    const T* dyr = dy + r * n;
    const T* xr = x + r * n;
    T* dxr = dx + r * n;
    T dot = T(0);
    for (int64_t i = 0; i < n; ++i) {
      dxr[i] = s * dyr[i];
      dot += dyr[i] * xr[i];
    }
    dg[r] = s * (T(1) - s) * dot;
  }
}

}  // namespace switchyard::cpu
