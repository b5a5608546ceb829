#include "kernels/cuda/elementwise.h"

#include <algorithm>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

// Partial sums of squares: a fixed number of blocks, so the order of the sum is fixed.
constexpr int kSumBlocks = 1024;

template <typename T>
__global__ void add_kernel(T* y, const T* x, float alpha, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    y[i] = static_cast<T>(static_cast<float>(y[i]) + alpha * static_cast<float>(x[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, float alpha, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    x[i] = static_cast<T>(static_cast<float>(x[i]) * alpha);
}

template <typename T, typename B>
__global__ void add_bias_kernel(T* y, const B* bias, int64_t rows, int64_t n) {
  for (int64_t i = grid_start(); i < rows * n; i += grid_stride())
    y[i] = static_cast<T>(static_cast<float>(y[i]) + static_cast<float>(bias[i % n]));
}

template <typename T>
struct ElementTerm {
  const T* dy;
  int64_t n;
  __device__ float operator()(int64_t r, int64_t c) const {
    return static_cast<float>(dy[r * n + c]);
  }
};

template <typename T>
__global__ void sum_squares_partial_kernel(const T* x, int64_t n, double* partial) {
  double sum = 0.0;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const double v = static_cast<double>(static_cast<float>(x[i]));
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Rows are summed in chunks of kRowChunk elements, one block per chunk, then each row's
// chunk sums in order: a row's sum depends on its length alone, not on the number of
// rows, and a long row (an expert's whole matrix) is spread over many blocks.
constexpr int64_t kRowChunk = 8192;

int64_t row_chunks(int64_t n) { return std::max<int64_t>(1, (n + kRowChunk - 1) / kRowChunk); }

template <typename T>
__global__ void row_chunk_squares_kernel(const T* x, int64_t rows, int64_t n, int64_t chunks,
                                         double* partial) {
  for (int64_t b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const int64_t r = b / chunks, begin = b % chunks * kRowChunk;
    const int64_t end = begin + kRowChunk < n ? begin + kRowChunk : n;
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double v = static_cast<double>(static_cast<float>(x[r * n + i]));
      sum += v * v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[b] = sum;
  }
}

__global__ void row_chunk_sums_kernel(const double* partial, int64_t rows, int64_t chunks,
                                      double* sums) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) sum += partial[r * chunks + c];
    sum = block_sum(sum);
    if (threadIdx.x == 0) sums[r] = sum;
  }
}

__global__ void sum_partials_kernel(const double* partial, int count, double* total) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *total = sum;
}

template <typename T, typename G>
__global__ void sigmoid_gate_forward_kernel(const T* x, const G* g, T* y, int64_t rows, int64_t n) {
  for (int64_t i = grid_start(); i < rows * n; i += grid_stride()) {
    const float s = sigmoid(static_cast<float>(g[i / n]));
    y[i] = static_cast<T>(static_cast<float>(y[i]) + s * static_cast<float>(x[i]));
  }
}

// One block per row: dx is elementwise, dg needs the row's dot product.
template <typename T, typename G>
__global__ void sigmoid_gate_backward_kernel(const T* dy, const T* x, const G* g, T* dx, G* dg,
                                             int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float s = sigmoid(static_cast<float>(g[r]));
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = static_cast<float>(dy[r * n + i]);
      dx[r * n + i] = static_cast<T>(s * d);
      dot += d * static_cast<float>(x[r * n + i]);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dg[r] = static_cast<G>(s * (1.0f - s) * dot);
  }
}

}  // namespace

template <typename T>
void add(T* y, const T* x, float alpha, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(y, x, alpha, n);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(x, alpha, n);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T, typename B>
void add_bias(T* y, const B* bias, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows * n == 0) return;
  add_bias_kernel<<<grid_blocks(rows * n), kThreads, 0, stream>>>(y, bias, rows, n);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void bias_backward(const T* dy, float* dbias, int64_t rows, int64_t n, cudaStream_t stream) {
  column_sums_accumulate(rows, n, ElementTerm<T>{dy, n}, dbias, stream);
}

template <typename T>
void sum_squares(const T* const* xs, const int64_t* ns, int count, double* totals,
                 cudaStream_t stream) {
  if (count == 0) return;
  // One scratch of block partials serves every array: the stream orders each array's
  // two kernels before the next array's.
  Scratch<double> partial(kSumBlocks, stream);
  SY_CUDA_CHECK(cudaMemsetAsync(totals, 0, static_cast<size_t>(count) * sizeof(double), stream));
  for (int i = 0; i < count; ++i) {
    if (ns[i] == 0) continue;
    sum_squares_partial_kernel<<<kSumBlocks, kThreads, 0, stream>>>(xs[i], ns[i], partial.get());
    SY_CUDA_CHECK_LAUNCH();
    sum_partials_kernel<<<1, kThreads, 0, stream>>>(partial.get(), kSumBlocks, totals + i);
    SY_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void row_sum_squares(const T* x, int64_t rows, int64_t n, double* sums, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t chunks = row_chunks(n);
  Scratch<double> partial(rows * chunks, stream);
  row_chunk_squares_kernel<<<grid_blocks(rows * chunks, 1), kThreads, 0, stream>>>(
      x, rows, n, chunks, partial.get());
  SY_CUDA_CHECK_LAUNCH();
  row_chunk_sums_kernel<<<grid_blocks(rows, 1), kThreads, 0, stream>>>(partial.get(), rows, chunks,
                                                                       sums);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T, typename G>
void sigmoid_gate_forward(const T* x, const G* g, T* y, int64_t rows, int64_t n,
                          cudaStream_t stream) {
  if (rows * n == 0) return;
  sigmoid_gate_forward_kernel<<<grid_blocks(rows * n), kThreads, 0, stream>>>(x, g, y, rows, n);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T, typename G>
void sigmoid_gate_backward(const T* dy, const T* x, const G* g, T* dx, G* dg, int64_t rows,
                           int64_t n, cudaStream_t stream) {
  if (rows == 0) return;
  sigmoid_gate_backward_kernel<<<grid_blocks(rows, 1), kThreads, 0, stream>>>(dy, x, g, dx, dg,
                                                                              rows, n);
  SY_CUDA_CHECK_LAUNCH();
}

#define SY_INSTANTIATE_ELEMENTWISE(T)                                                        \
  template void add<T>(T*, const T*, float, int64_t, cudaStream_t);                          \
  template void scale<T>(T*, float, int64_t, cudaStream_t);                                  \
  template void bias_backward<T>(const T*, float*, int64_t, int64_t, cudaStream_t);          \
  template void sum_squares<T>(const T* const*, const int64_t*, int, double*, cudaStream_t); \
  template void row_sum_squares<T>(const T*, int64_t, int64_t, double*, cudaStream_t);
#define SY_INSTANTIATE_ELEMENTWISE_PAIR(T, U)                                              \
  template void add_bias<T, U>(T*, const U*, int64_t, int64_t, cudaStream_t);              \
  template void sigmoid_gate_forward<T, U>(const T*, const U*, T*, int64_t, int64_t,       \
                                           cudaStream_t);                                  \
  template void sigmoid_gate_backward<T, U>(const T*, const T*, const U*, T*, U*, int64_t, \
                                            int64_t, cudaStream_t);
SY_INSTANTIATE_ELEMENTWISE(float)
SY_INSTANTIATE_ELEMENTWISE(__nv_bfloat16)
SY_INSTANTIATE_ELEMENTWISE_PAIR(float, float)
SY_INSTANTIATE_ELEMENTWISE_PAIR(float, __nv_bfloat16)
SY_INSTANTIATE_ELEMENTWISE_PAIR(__nv_bfloat16, float)
SY_INSTANTIATE_ELEMENTWISE_PAIR(__nv_bfloat16, __nv_bfloat16)
#undef SY_INSTANTIATE_ELEMENTWISE
#undef SY_INSTANTIATE_ELEMENTWISE_PAIR

}  // namespace switchyard::cuda
