#include "kernels/cuda/router_aux.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// Row kernels use small blocks: one thread does a whole row.
constexpr int kRowThreads = 128;

__global__ void routing_counts_kernel(const float* probs, const int32_t* expert_ids, int64_t n,
                                      int64_t experts, int64_t k, float* selections,
                                      float* prob_sums) {
  const int64_t e = blockIdx.x;
  double count = 0.0;
  for (int64_t a = threadIdx.x; a < n * k; a += blockDim.x) count += expert_ids[a] == e ? 1.0 : 0.0;
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) sum += probs[t * experts + e];
  count = block_sum(count);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    selections[e] = static_cast<float>(count);
    prob_sums[e] = static_cast<float>(sum);
  }
}

__global__ void aux_loss_backward_kernel(const float* probs, const float* prob_grad, int64_t n,
                                         int64_t experts, float* dlogits) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) {
    const float* p = probs + t * experts;
    float dot = 0.0f;
    for (int64_t e = 0; e < experts; ++e) dot += p[e] * prob_grad[e];
    for (int64_t e = 0; e < experts; ++e) dlogits[t * experts + e] += p[e] * (prob_grad[e] - dot);
  }
}

}  // namespace

void routing_counts(const float* probs, const int32_t* expert_ids, int64_t n, int64_t experts,
                    int64_t k, float* selections, float* prob_sums, cudaStream_t stream) {
  if (experts == 0) return;
  SY_CHECK_MSG(experts <= INT32_MAX, "routing_counts: too many experts for one block each");
  routing_counts_kernel<<<static_cast<unsigned int>(experts), kThreads, 0, stream>>>(
      probs, expert_ids, n, experts, k, selections, prob_sums);
  SY_CUDA_CHECK_LAUNCH();
}

void aux_loss_backward(const float* probs, const float* prob_grad, int64_t n, int64_t experts,
                       float* dlogits, cudaStream_t stream) {
  if (n == 0) return;
  aux_loss_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      probs, prob_grad, n, experts, dlogits);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
