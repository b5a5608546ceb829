// CUDA elementwise and reduction kernels (twins of kernels/cpu/elementwise.h). Templates on
// the element type, explicitly instantiated for float; arithmetic is in float. All run
// on `stream`; only sum_squares waits for its result.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// y += alpha * x over n elements.
template <typename T>
void add(T* y, const T* x, float alpha, int64_t n, cudaStream_t stream);
// x *= alpha over n elements.
template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t stream);
// y: (rows, n) += bias: (n) on every row.
template <typename T>
void add_bias(T* y, const T* bias, int64_t rows, int64_t n, cudaStream_t stream);
// dbias: (n) += column sums of dy: (rows, n), in a fixed order.
template <typename T>
void bias_backward(const T* dy, T* dbias, int64_t rows, int64_t n, cudaStream_t stream);
// Sum of squares over n elements in double, in a fixed order; blocks until the value is
// on the host.
template <typename T>
double sum_squares(const T* x, int64_t n, cudaStream_t stream);
// y[r] += sigmoid(g[r]) * x[r]; x, y: (rows, n), g: (rows).
template <typename T>
void sigmoid_gate_forward(const T* x, const T* g, T* y, int64_t rows, int64_t n,
                          cudaStream_t stream);
// dx[r] = sigmoid(g[r]) * dy[r]; dg[r] = s (1 - s) dot(dy[r], x[r]) (both written).
template <typename T>
void sigmoid_gate_backward(const T* dy, const T* x, const T* g, T* dx, T* dg, int64_t rows,
                           int64_t n, cudaStream_t stream);

}  // namespace switchyard::cuda
