#include "kernels/cuda/gating.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"
#include "kernels/top_k_selection.h"

namespace switchyard::cuda {
namespace {

// Row kernels use small blocks: one thread does a whole row.
constexpr int kRowThreads = 128;

__device__ float row_max(const float* x, int64_t count) {
  float max = x[0];
  for (int64_t i = 1; i < count; ++i) max = max < x[i] ? x[i] : max;  // std::max's NaN rule
  return max;
}

__device__ float logsumexp_row(const float* x, int64_t count) {
  const float max = row_max(x, count);
  float sum = 0.0f;
  for (int64_t i = 0; i < count; ++i) sum += expf(x[i] - max);
  return max + logf(sum);
}

__global__ void gating_forward_kernel(const float* logits, float* probs, int32_t* expert_ids,
                                      float* weights, int64_t n, int64_t num_experts, int k,
                                      bool renormalize) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const float* l = logits + r * num_experts;
    float* p = probs + r * num_experts;
    int32_t* ids = expert_ids + r * k;
    float* w = weights + r * k;
    const float max = row_max(l, num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      p[e] = expf(l[e] - max);
      sum += p[e];
    }
    for (int64_t e = 0; e < num_experts; ++e) p[e] /= sum;
    select_top_k(p, num_experts, k, renormalize, ids, w);
  }
}

// With renormalisation w_j = p_j / S, so dp_j = (dw_j - sum_i dw_i w_i) / S on the selected
// experts and 0 elsewhere; then dlogit = p * (dp - sum(p * dp)).
__global__ void gating_backward_kernel(const float* probs, const int32_t* expert_ids,
                                       const float* dweights, float* dlogits, int64_t n,
                                       int64_t num_experts, int k, bool renormalize) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const float* p = probs + r * num_experts;
    const int32_t* ids = expert_ids + r * k;
    const float* dw = dweights + r * k;
    float* dl = dlogits + r * num_experts;
    float sum_p = 0.0f;
    float sum_dw_p = 0.0f;
    for (int j = 0; j < k; ++j) {
      sum_p += p[ids[j]];
      sum_dw_p += dw[j] * p[ids[j]];
    }
    const float a = renormalize ? 1.0f / sum_p : 1.0f;
    const float b = renormalize ? -sum_dw_p / (sum_p * sum_p) : 0.0f;
    float p_dot_dp = 0.0f;
    for (int j = 0; j < k; ++j) p_dot_dp += p[ids[j]] * (a * dw[j] + b);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] = -p[e] * p_dot_dp;
    for (int j = 0; j < k; ++j) dl[ids[j]] = p[ids[j]] * (a * dw[j] + b - p_dot_dp);
  }
}

__global__ void squared_lse_kernel(const float* logits, int64_t n, int64_t num_experts,
                                   double* squared) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const double lse = static_cast<double>(logsumexp_row(logits + r * num_experts, num_experts));
    squared[r] = lse * lse;
  }
}

// One block adds the n values: thread t takes every blockDim-th one, then the block sum.
__global__ void ordered_sum_kernel(const double* values, int64_t n, double* total) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += values[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *total = sum;
}

__global__ void router_z_loss_backward_kernel(const float* logits, float scale, float* dlogits,
                                              int64_t n, int64_t num_experts) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const float* row = logits + r * num_experts;
    float* dl = dlogits + r * num_experts;
    const float lse = logsumexp_row(row, num_experts);
    const float coeff = scale * 2.0f * lse / static_cast<float>(n);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] += coeff * expf(row[e] - lse);
  }
}

}  // namespace

void gating_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                    int64_t n, int64_t num_experts, int k, bool renormalize, cudaStream_t stream) {
  if (n == 0) return;
  gating_forward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, probs, expert_ids, weights, n, num_experts, k, renormalize);
  SY_CUDA_CHECK_LAUNCH();
}

void gating_backward(const float* probs, const int32_t* expert_ids, const float* dweights,
                     float* dlogits, int64_t n, int64_t num_experts, int k, bool renormalize,
                     cudaStream_t stream) {
  if (n == 0) return;
  gating_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      probs, expert_ids, dweights, dlogits, n, num_experts, k, renormalize);
  SY_CUDA_CHECK_LAUNCH();
}

double router_z_loss_forward(const float* logits, int64_t n, int64_t num_experts,
                             cudaStream_t stream) {
  if (n == 0) return 0.0;
  Scratch<double> squared(n + 1, stream);
  double* total = squared.get() + n;
  squared_lse_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, n, num_experts, squared.get());
  SY_CUDA_CHECK_LAUNCH();
  ordered_sum_kernel<<<1, 1024, 0, stream>>>(squared.get(), n, total);
  SY_CUDA_CHECK_LAUNCH();
  double host_total = 0.0;
  SY_CUDA_CHECK(
      cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  SY_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_total / static_cast<double>(n);
}

void router_z_loss_backward(const float* logits, float scale, float* dlogits, int64_t n,
                            int64_t num_experts, cudaStream_t stream) {
  if (n == 0) return;
  router_z_loss_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, scale, dlogits, n, num_experts);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
