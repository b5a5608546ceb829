// Deterministic column sums of a (rows, cols) term, for the parameter gradients that sum
// over rows (bias, RMSNorm weight). Blocks of rows make partial sums, which each column
// then adds in block order: the summation order depends only on the shape, never on
// scheduling, and no atomics are involved.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {

namespace column_sum_internal {

inline constexpr int kColumns = 32;  // columns per block (one warp across)
inline constexpr int kRowLanes = 8;  // threads per column inside a block
inline constexpr int64_t kMaxChunks = 256;

// partial[chunk, c] = sum over the chunk's rows of term(r, c); the 8 row lanes of a column
// each sum every 8th row, then lane sums are added in lane order.
template <typename Term>
__global__ void partial_sums_kernel(int64_t rows, int64_t cols, int64_t rows_per_chunk, Term term,
                                    float* partial) {
  __shared__ float lane_sums[kRowLanes][kColumns + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) sum += term(r, c);
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += lane_sums[lane][threadIdx.x];
    partial[blockIdx.y * cols + c] = total;
  }
}

template <typename T>
__global__ void add_partials_kernel(const float* partial, int64_t chunks, int64_t cols, T* out) {
  for (int64_t c = grid_start(); c < cols; c += grid_stride()) {
    float total = 0.0f;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) total += partial[chunk * cols + c];
    out[c] = static_cast<T>(static_cast<float>(out[c]) + total);
  }
}

}  // namespace column_sum_internal

// out[c] += sum over r in [0, rows) of term(r, c), for c in [0, cols). `term` is a
// device-callable object returning float.
template <typename T, typename Term>
void column_sums_accumulate(int64_t rows, int64_t cols, Term term, T* out, cudaStream_t stream) {
  using namespace column_sum_internal;
  if (rows == 0 || cols == 0) return;
  const int64_t wanted_chunks = std::min(kMaxChunks, (rows + 31) / 32);
  const int64_t rows_per_chunk = (rows + wanted_chunks - 1) / wanted_chunks;
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  Scratch<float> partial(chunks * cols, stream);
  const dim3 grid(static_cast<unsigned int>((cols + kColumns - 1) / kColumns),
                  static_cast<unsigned int>(chunks));
  partial_sums_kernel<<<grid, dim3(kColumns, kRowLanes), 0, stream>>>(rows, cols, rows_per_chunk,
                                                                      term, partial.get());
  SY_CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<grid_blocks(cols), kThreads, 0, stream>>>(partial.get(), chunks, cols, out);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
