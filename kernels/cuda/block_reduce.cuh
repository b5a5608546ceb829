// Warp and block reductions in a fixed order: the tree depends only on blockDim, so a
// kernel gives the same bits on every run. blockDim.x must be a multiple of 32 and at
// most 1024, and every thread of the block must call them.
#pragma once

#include <cmath>

namespace switchyard::cuda {

// Butterfly sum: after each step partner lanes hold the same bits (addition commutes),
// so every lane ends with the identical total.
template <typename T>
__device__ T warp_sum(T value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

template <typename T>
__device__ T warp_max(T value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmax(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Sum (or max) of `value` over the block, returned to every thread.
template <typename T>
__device__ T block_sum(T value) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = warp_sum(value);
  __syncthreads();  // an earlier call's readers are done with `partial`
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : T(0));
}

template <typename T>
__device__ T block_max(T value) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  return warp_max(lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : -INFINITY);
}

}  // namespace switchyard::cuda
