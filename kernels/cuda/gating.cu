#include "core/runtime/rng.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gating.h"
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

// Softmax, top-k and weights of row r; returns the row's log-sum-exp (the same bits as
// logsumexp_row).
__device__ float gate_row(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                          int64_t r, int64_t num_experts, int k, bool renormalize) {
  const float* l = logits + r * num_experts;
  float* p = probs + r * num_experts;
  const float max = row_max(l, num_experts);
  float sum = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) {
    p[e] = expf(l[e] - max);
    sum += p[e];
  }
  for (int64_t e = 0; e < num_experts; ++e) p[e] /= sum;
  select_top_k(p, num_experts, k, renormalize, expert_ids + r * k, weights + r * k);
  return max + logf(sum);
}

__global__ void gating_forward_kernel(const float* logits, float* probs, int32_t* expert_ids,
                                      float* weights, int64_t n, int64_t num_experts, int k,
                                      bool renormalize) {
  for (int64_t r = grid_start(); r < n; r += grid_stride())
    gate_row(logits, probs, expert_ids, weights, r, num_experts, k, renormalize);
}

// The fused router: each block takes chunks of kRouterChunk tokens (chunk blockIdx.x,
// then every gridDim.x-th). One thread per token gates its row; then the block's threads
// take the experts and add the chunk's probabilities and selections, in token order, to
// the block's running sums in shared memory, and thread 0 adds the chunk's squared
// log-sum-exps. Each block leaves its sums in the partials, which router_totals_kernel
// adds in block order: the bits depend only on n and E. The chunk's outputs are read
// back from global memory, visible to the block after __syncthreads.
constexpr int kRouterChunk = 32;
constexpr int kRouterThreads = 128;
constexpr int64_t kRouterMaxBlocks = 512;

__global__ void router_forward_kernel(const float* logits, float* probs, int32_t* expert_ids,
                                      float* weights, int64_t n, int64_t num_experts, int k,
                                      bool renormalize, double* partial_probs,
                                      int64_t* partial_selections, double* partial_z) {
  extern __shared__ double shared[];
  double* prob_sum = shared;                    // [num_experts]
  double* chunk_z = shared + num_experts;       // [kRouterChunk]
  auto* selected = reinterpret_cast<int64_t*>(chunk_z + kRouterChunk);  // [num_experts]
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    prob_sum[e] = 0.0;
    selected[e] = 0;
  }
  double z = 0.0;  // thread 0's
  const int64_t chunks = (n + kRouterChunk - 1) / kRouterChunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t first = c * kRouterChunk;
    const int rows = static_cast<int>(n - first < kRouterChunk ? n - first : kRouterChunk);
    if (threadIdx.x < rows) {
      const double lse = static_cast<double>(gate_row(logits, probs, expert_ids, weights,
                                                      first + threadIdx.x, num_experts, k,
                                                      renormalize));
      chunk_z[threadIdx.x] = lse * lse;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
      double sum = prob_sum[e];
      int64_t count = selected[e];
      for (int t = 0; t < rows; ++t) {
        sum += probs[(first + t) * num_experts + e];
        const int32_t* ids = expert_ids + (first + t) * k;
        for (int j = 0; j < k; ++j) count += ids[j] == e;
      }
      prob_sum[e] = sum;
      selected[e] = count;
    }
    if (threadIdx.x == 0)
      for (int t = 0; t < rows; ++t) z += chunk_z[t];
    __syncthreads();  // chunk_z is refilled by the next chunk
  }
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    partial_probs[blockIdx.x * num_experts + e] = prob_sum[e];
    partial_selections[blockIdx.x * num_experts + e] = selected[e];
  }
  if (threadIdx.x == 0) partial_z[blockIdx.x] = z;
}

__global__ void router_totals_kernel(const double* partial_probs, const int64_t* partial_selections,
                                     const double* partial_z, int64_t blocks, int64_t num_experts,
                                     float* sums) {
  for (int64_t e = grid_start(); e < num_experts; e += grid_stride()) {
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      sum += partial_probs[b * num_experts + e];
      count += partial_selections[b * num_experts + e];
    }
    sums[e] = static_cast<float>(count);
    sums[num_experts + e] = static_cast<float>(sum);
  }
  if (grid_start() == 0) {
    double z = 0.0;
    for (int64_t b = 0; b < blocks; ++b) z += partial_z[b];
    sums[2 * num_experts] = static_cast<float>(z);
  }
}

__global__ void gshard_dispatch_kernel(const int32_t* expert_ids, const float* weights, int64_t n,
                                       uint64_t seed, uint64_t first_draw, int32_t* dispatch_ids) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) {
    dispatch_ids[2 * t] = expert_ids[2 * t];
    const bool sent = Rng::uniform_at(seed, first_draw + static_cast<uint64_t>(t)) <
                      2.0 * static_cast<double>(weights[2 * t + 1]);
    dispatch_ids[2 * t + 1] = sent ? expert_ids[2 * t + 1] : -1;
  }
}

// With renormalisation w_j = p_j / S, so dp_j = (dw_j - sum_i dw_i w_i) / S on the selected
// experts and 0 elsewhere; then dlogit = p * (dp - sum(p * dp)). An expert id of -1 (no
// expert) is skipped, as on the CPU.
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
      if (ids[j] < 0) continue;
      sum_p += p[ids[j]];
      sum_dw_p += dw[j] * p[ids[j]];
    }
    const float a = renormalize ? 1.0f / sum_p : 1.0f;
    const float b = renormalize ? -sum_dw_p / (sum_p * sum_p) : 0.0f;
    float p_dot_dp = 0.0f;
    for (int j = 0; j < k; ++j)
      if (ids[j] >= 0) p_dot_dp += p[ids[j]] * (a * dw[j] + b);
    for (int64_t e = 0; e < num_experts; ++e) dl[e] = -p[e] * p_dot_dp;
    for (int j = 0; j < k; ++j)
      if (ids[j] >= 0) dl[ids[j]] = p[ids[j]] * (a * dw[j] + b - p_dot_dp);
  }
}

__global__ void sigmoid_gating_forward_kernel(const float* logits, const float* bias,
                                              float* scores, int32_t* expert_ids, float* weights,
                                              int64_t n, int64_t num_experts, SigmoidGating g) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const float* l = logits + r * num_experts;
    float* s = scores + r * num_experts;
    for (int64_t e = 0; e < num_experts; ++e) s[e] = 1.0f / (1.0f + expf(-l[e]));
    select_sigmoid_top_k(s, bias, num_experts, g, expert_ids + r * g.k, weights + r * g.k);
  }
}

// As the CPU: ds_i = c (dw_i - sum_j dw_j s_j / (S + eps)) / (S + eps) renormalised, else
// c dw_i, on the chosen experts (an id of -1 skipped); dlogit = ds s (1 - s).
__global__ void sigmoid_gating_backward_kernel(const float* scores, const int32_t* expert_ids,
                                               const float* dweights, float* dlogits, int64_t n,
                                               int64_t num_experts, SigmoidGating g) {
  for (int64_t r = grid_start(); r < n; r += grid_stride()) {
    const float* s = scores + r * num_experts;
    const int32_t* ids = expert_ids + r * g.k;
    const float* dw = dweights + r * g.k;
    float* dl = dlogits + r * num_experts;
    float total = 0.0f, dw_dot_s = 0.0f;
    for (int j = 0; j < g.k; ++j) {
      if (ids[j] < 0) continue;
      total += s[ids[j]];
      dw_dot_s += dw[j] * s[ids[j]];
    }
    const float denominator = total + 1e-20f;
    for (int64_t e = 0; e < num_experts; ++e) dl[e] = 0.0f;
    for (int j = 0; j < g.k; ++j) {
      if (ids[j] < 0) continue;
      const float ds = g.renormalize ? g.scaling * (dw[j] - dw_dot_s / denominator) / denominator
                                     : g.scaling * dw[j];
      const float si = s[ids[j]];
      dl[ids[j]] = ds * si * (1.0f - si);
    }
  }
}

__global__ void expert_choice_forward_kernel(const float* probs, int32_t* expert_ids,
                                             float* weights, int64_t n, int64_t num_experts,
                                             int64_t capacity) {
  for (int64_t a = grid_start(); a < n * num_experts; a += grid_stride()) {
    const int64_t t = a / num_experts, e = a % num_experts;
    const bool taken = expert_takes_token(probs, n, num_experts, capacity, t, e);
    expert_ids[a] = taken ? static_cast<int32_t>(e) : -1;
    weights[a] = taken ? probs[a] : 0.0f;
  }
}

__global__ void expert_choice_backward_kernel(const float* probs, const int32_t* expert_ids,
                                              const float* dweights, float* dlogits, int64_t n,
                                              int64_t num_experts) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) {
    const float* p = probs + t * num_experts;
    const int32_t* ids = expert_ids + t * num_experts;
    const float* dw = dweights + t * num_experts;
    float* dl = dlogits + t * num_experts;
    float p_dot_dp = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) p_dot_dp += ids[e] >= 0 ? p[e] * dw[e] : 0.0f;
    for (int64_t e = 0; e < num_experts; ++e)
      dl[e] = p[e] * ((ids[e] >= 0 ? dw[e] : 0.0f) - p_dot_dp);
  }
}

__global__ void round_robin_kernel(int64_t first_token, int32_t* expert_ids, float* weights,
                                   int64_t n, int64_t num_experts, int k) {
  for (int64_t a = grid_start(); a < n * k; a += grid_stride()) {
    expert_ids[a] = static_cast<int32_t>((first_token * k + a) % num_experts);
    weights[a] = 1.0f / static_cast<float>(k);
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
__global__ void ordered_sum_kernel(const double* values, int64_t n, float* total) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += values[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *total = static_cast<float>(sum);
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

void router_forward(const float* logits, float* probs, int32_t* expert_ids, float* weights,
                    float* sums, int64_t n, int64_t num_experts, int k, bool renormalize,
                    cudaStream_t stream) {
  SY_CHECK(num_experts <= kFusedRouterMaxExperts);
  if (n == 0) {
    SY_CUDA_CHECK(cudaMemsetAsync(sums, 0, (2 * num_experts + 1) * sizeof(float), stream));
    return;
  }
  const int64_t chunks = (n + kRouterChunk - 1) / kRouterChunk;
  const int64_t blocks = chunks < kRouterMaxBlocks ? chunks : kRouterMaxBlocks;
  Scratch<double> partial_probs(blocks * num_experts, stream);
  Scratch<int64_t> partial_selections(blocks * num_experts, stream);
  Scratch<double> partial_z(blocks, stream);
  const size_t shared_bytes = static_cast<size_t>(2 * num_experts + kRouterChunk) * 8;
  router_forward_kernel<<<static_cast<unsigned int>(blocks), kRouterThreads, shared_bytes,
                          stream>>>(logits, probs, expert_ids, weights, n, num_experts, k,
                                    renormalize, partial_probs.get(), partial_selections.get(),
                                    partial_z.get());
  SY_CUDA_CHECK_LAUNCH();
  router_totals_kernel<<<grid_blocks(num_experts, kRouterThreads), kRouterThreads, 0, stream>>>(
      partial_probs.get(), partial_selections.get(), partial_z.get(), blocks, num_experts, sums);
  SY_CUDA_CHECK_LAUNCH();
}

void gshard_dispatch_ids(const int32_t* expert_ids, const float* weights, int64_t n, uint64_t seed,
                         uint64_t first_draw, int32_t* dispatch_ids, cudaStream_t stream) {
  if (n == 0) return;
  gshard_dispatch_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      expert_ids, weights, n, seed, first_draw, dispatch_ids);
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

void sigmoid_gating_forward(const float* logits, const float* bias, float* scores,
                            int32_t* expert_ids, float* weights, int64_t n, int64_t num_experts,
                            const SigmoidGating& g, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_gating_forward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, bias, scores, expert_ids, weights, n, num_experts, g);
  SY_CUDA_CHECK_LAUNCH();
}

void sigmoid_gating_backward(const float* scores, const int32_t* expert_ids,
                             const float* dweights, float* dlogits, int64_t n,
                             int64_t num_experts, const SigmoidGating& g, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_gating_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      scores, expert_ids, dweights, dlogits, n, num_experts, g);
  SY_CUDA_CHECK_LAUNCH();
}

void expert_choice_forward(const float* probs, int32_t* expert_ids, float* weights, int64_t n,
                           int64_t num_experts, int64_t capacity, cudaStream_t stream) {
  if (n == 0) return;
  expert_choice_forward_kernel<<<grid_blocks(n * num_experts), kThreads, 0, stream>>>(
      probs, expert_ids, weights, n, num_experts, capacity);
  SY_CUDA_CHECK_LAUNCH();
}

void expert_choice_backward(const float* probs, const int32_t* expert_ids, const float* dweights,
                            float* dlogits, int64_t n, int64_t num_experts, cudaStream_t stream) {
  if (n == 0) return;
  expert_choice_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      probs, expert_ids, dweights, dlogits, n, num_experts);
  SY_CUDA_CHECK_LAUNCH();
}

void round_robin_routing(int64_t first_token, int32_t* expert_ids, float* weights, int64_t n,
                         int64_t num_experts, int k, cudaStream_t stream) {
  if (n == 0) return;
  round_robin_kernel<<<grid_blocks(n * k), kThreads, 0, stream>>>(first_token, expert_ids,
                                                                  weights, n, num_experts, k);
  SY_CUDA_CHECK_LAUNCH();
}

void router_z_loss_sum(const float* logits, int64_t n, int64_t num_experts, float* z_sum,
                       cudaStream_t stream) {
  if (n == 0) {
    SY_CUDA_CHECK(cudaMemsetAsync(z_sum, 0, sizeof(float), stream));
    return;
  }
  Scratch<double> squared(n, stream);
  squared_lse_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, n, num_experts, squared.get());
  SY_CUDA_CHECK_LAUNCH();
  ordered_sum_kernel<<<1, 1024, 0, stream>>>(squared.get(), n, z_sum);
  SY_CUDA_CHECK_LAUNCH();
}

void router_z_loss_backward(const float* logits, float scale, float* dlogits, int64_t n,
                            int64_t num_experts, cudaStream_t stream) {
  if (n == 0) return;
  router_z_loss_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      logits, scale, dlogits, n, num_experts);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
