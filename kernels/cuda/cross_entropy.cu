#include "kernels/cuda/cross_entropy.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// A running log-sum-exp: the largest logit seen and the sum of exp(logit - max) over the
// logits seen; (-inf, 0) has seen none.
struct MaxSum {
  float max;
  float sum;
};

// Adds one logit. One equal to the max adds exactly 1, so -inf logits (masked columns)
// seen before any finite one never compute exp(-inf - -inf) = NaN; a NaN logit never
// becomes the max and turns the sum NaN, as on the CPU.
__device__ inline void add_logit(MaxSum& acc, float x) {
  if (x > acc.max) {
    acc.sum = acc.sum * expf(acc.max - x) + 1.0f;
    acc.max = x;
  } else {
    acc.sum += x == acc.max ? 1.0f : expf(x - acc.max);
  }
}

// acc's sum rescaled to `max` (no less than acc.max). An equal max keeps the sum as it
// is, for the same reason as above: merging pairs whose max is -inf stays finite.
__device__ inline float sum_at(MaxSum acc, float max) {
  return acc.max == max ? acc.sum : acc.sum * expf(acc.max - max);
}

// Symmetric bit for bit (fmaxf and the one addition commute), so after each butterfly
// step partner lanes hold the same pair.
__device__ inline MaxSum merge(MaxSum a, MaxSum b) {
  const float max = fmaxf(a.max, b.max);
  return {max, sum_at(a, max) + sum_at(b, max)};
}

__device__ MaxSum warp_merge(MaxSum value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, value.max, offset),
                       __shfl_xor_sync(0xffffffffu, value.sum, offset)};
    value = merge(value, other);
  }
  return value;
}

// The pairs of the whole block merged, returned to every thread: a warp butterfly, then
// every warp merges the warps' pairs in the same butterfly. The tree depends only on
// blockDim (a multiple of 32, at most 1024), like the sums in block_reduce.cuh.
__device__ MaxSum block_merge(MaxSum value) {
  __shared__ float max_partial[32];
  __shared__ float sum_partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = warp_merge(value);
  __syncthreads();  // the previous row's readers are done with the partials
  if (lane == 0) {
    max_partial[warp] = value.max;
    sum_partial[warp] = value.sum;
  }
  __syncthreads();
  const bool live = lane < static_cast<int>(blockDim.x / 32);
  return warp_merge(live ? MaxSum{max_partial[lane], sum_partial[lane]} : MaxSum{-INFINITY, 0.0f});
}

// log(sum_j exp(x[j])) over one row of `count` logits, read once; every thread of the
// block must call it and gets the value. Thread t takes columns t, t + blockDim, ... in
// order.
__device__ float block_logsumexp(const float* x, int64_t count) {
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) add_logit(acc, x[j]);
  acc = block_merge(acc);
  return acc.max + logf(acc.sum);
}

// Called by thread 0 alone, so a bad target is reported once, not once per thread.
__device__ void check_target(int32_t target, int64_t whole) {
  SY_DEVICE_CHECK(target < whole, "cross_entropy: target outside the vocabulary");
}

// One block per row (grid-stride over rows, so the loop and the block merge inside it
// are uniform across the block).
__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, int64_t n,
                                             int64_t vocab, float* losses, float* lse) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * vocab;
    const float row_lse = block_logsumexp(x, vocab);
    if (threadIdx.x == 0) {
      const int32_t target = targets[r];
      check_target(target, vocab);
      lse[r] = row_lse;
      losses[r] = target < 0 ? 0.0f : row_lse - x[target];
    }
  }
}

// A float dlogits may alias logits: no restrict, and each element is read and then
// written by one thread. The one-hot term is subtracted after the scaling, as the CPU
// kernel does, and a bf16 gradient is rounded once from that float.
template <typename T>
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets,
                                              const float* lse, float scale, int64_t n,
                                              int64_t vocab, int64_t vocab_start, int64_t whole,
                                              T* dlogits) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int32_t target = targets[r];
    if (threadIdx.x == 0) check_target(target, whole);
    const float* x = logits + r * vocab;
    T* d = dlogits + r * vocab;
    if (target < 0) {
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) d[j] = static_cast<T>(0.0f);
      continue;
    }
    const float shift = lse[r];
    const int64_t local = target - vocab_start;  // in [0, vocab) when the shard holds it
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = scale * expf(x[j] - shift);
      if (j == local) g -= scale;
      d[j] = static_cast<T>(g);
    }
  }
}

__global__ void cross_entropy_shard_forward_kernel(const float* logits, const int32_t* targets,
                                                   int64_t n, int64_t vocab, int64_t vocab_start,
                                                   int64_t whole, float* lse,
                                                   float* target_logits) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * vocab;
    const float row_lse = block_logsumexp(x, vocab);
    if (threadIdx.x == 0) {
      const int32_t target = targets[r];
      check_target(target, whole);
      const int64_t local = target - vocab_start;
      lse[r] = row_lse;
      target_logits[r] = target >= 0 && local >= 0 && local < vocab ? x[local] : 0.0f;
    }
  }
}

}  // namespace

void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                           float* losses, float* lse, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_forward_kernel<<<grid_blocks(n, 1), kThreads, 0, stream>>>(logits, targets, n,
                                                                           vocab, losses, lse);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                            float scale, int64_t n, int64_t vocab, int64_t vocab_start,
                            int64_t whole, T* dlogits, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_backward_kernel<<<grid_blocks(n, 1), kThreads, 0, stream>>>(
      logits, targets, lse, scale, n, vocab, vocab_start, whole, dlogits);
  SY_CUDA_CHECK_LAUNCH();
}

void cross_entropy_shard_forward(const float* logits, const int32_t* targets, int64_t n,
                                 int64_t vocab, int64_t vocab_start, int64_t whole, float* lse,
                                 float* target_logits, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_shard_forward_kernel<<<grid_blocks(n, 1), kThreads, 0, stream>>>(
      logits, targets, n, vocab, vocab_start, whole, lse, target_logits);
  SY_CUDA_CHECK_LAUNCH();
}

template void cross_entropy_backward<float>(const float*, const int32_t*, const float*, float,
                                            int64_t, int64_t, int64_t, int64_t, float*,
                                            cudaStream_t);
template void cross_entropy_backward<__nv_bfloat16>(const float*, const int32_t*, const float*,
                                                    float, int64_t, int64_t, int64_t, int64_t,
                                                    __nv_bfloat16*, cudaStream_t);

}  // namespace switchyard::cuda
