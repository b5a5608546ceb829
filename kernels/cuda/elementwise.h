// CUDA elementwise and reduction kernels (twins of kernels/cpu/elementwise.h). Templates on
// the element types, explicitly instantiated for float and __nv_bfloat16 (every
// combination where two are named): elements are loaded as float, arithmetic and sums run
// in float and each stored element is rounded once. Parameter gradients (dbias) are
// float. All run on `stream` and none waits for it.
#pragma once

#include <cuda_bf16.h>
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
template <typename T, typename B>
void add_bias(T* y, const B* bias, int64_t rows, int64_t n, cudaStream_t stream);
// dbias: (n) += column sums of dy: (rows, n), in a fixed order.
template <typename T>
void bias_backward(const T* dy, float* dbias, int64_t rows, int64_t n, cudaStream_t stream);
// Sums of squares of `count` arrays (xs[i] of ns[i] elements) in double, each in a
// fixed order, into totals[i] on the device.
template <typename T>
void sum_squares(const T* const* xs, const int64_t* ns, int count, double* totals,
                 cudaStream_t stream);
// Sums of squares of each row of x: (rows, n) in double, in an order fixed by n alone,
// into sums[r] on the device; two launches for all rows, long rows over many blocks.
template <typename T>
void row_sum_squares(const T* x, int64_t rows, int64_t n, double* sums, cudaStream_t stream);
// y[r] += sigmoid(g[r]) * x[r]; x, y: (rows, n), g: (rows).
template <typename T, typename G>
void sigmoid_gate_forward(const T* x, const G* g, T* y, int64_t rows, int64_t n,
                          cudaStream_t stream);
// dx[r] = sigmoid(g[r]) * dy[r]; dg[r] = s (1 - s) dot(dy[r], x[r]) (both written).
template <typename T, typename G>
void sigmoid_gate_backward(const T* dy, const T* x, const G* g, T* dx, G* dg, int64_t rows,
                           int64_t n, cudaStream_t stream);

}  // namespace switchyard::cuda
