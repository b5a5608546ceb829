#include "kernels/cuda/sequence_aux.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

constexpr int kRowThreads = 128;

__device__ float score_total(const float* p, int64_t experts, bool normalize) {
  if (!normalize) return 1.0f;
  float total = 0.0f;
  for (int64_t e = 0; e < experts; ++e) total += p[e];
  return total;
}

__global__ void sequence_routing_sums_kernel(const float* probs, const int32_t* expert_ids,
                                             int64_t n, int64_t experts, int64_t k,
                                             bool normalize, int64_t first_token,
                                             int64_t seq_len, float* sums) {
  const int64_t sequence = blockIdx.x / experts;
  const int64_t e = blockIdx.x % experts;
  // This rank's rows of the sequence.
  const int64_t start = sequence * seq_len - first_token;
  const int64_t stop = start + seq_len;
  const int64_t begin = start > 0 ? start : 0;
  const int64_t end = stop < n ? stop : n;
  double count = 0.0, sum = 0.0;
  for (int64_t t = begin + threadIdx.x; t < end; t += blockDim.x) {
    for (int64_t j = 0; j < k; ++j) count += expert_ids[t * k + j] == e ? 1.0 : 0.0;
    const float* p = probs + t * experts;
    sum += static_cast<double>(p[e]) / score_total(p, experts, normalize);
  }
  count = block_sum(count);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    sums[sequence * 2 * experts + e] = static_cast<float>(count);
    sums[sequence * 2 * experts + experts + e] = static_cast<float>(sum);
  }
}

__global__ void sequence_aux_backward_kernel(const float* probs, const float* sums, int64_t n,
                                             int64_t experts, bool normalize,
                                             int64_t first_token, int64_t seq_len, float scale,
                                             float* dlogits) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) {
    const float* selections = sums + (first_token + t) / seq_len * 2 * experts;
    const float* p = probs + t * experts;
    const float total = score_total(p, experts, normalize);
    float dot = 0.0f;
    for (int64_t e = 0; e < experts; ++e) dot += p[e] / total * scale * selections[e];
    for (int64_t e = 0; e < experts; ++e) {
      const float slope = normalize ? p[e] * (1.0f - p[e]) / total : p[e];
      dlogits[t * experts + e] += slope * (scale * selections[e] - dot);
    }
  }
}

}  // namespace

void sequence_routing_sums(const float* probs, const int32_t* expert_ids, int64_t n,
                           int64_t experts, int64_t k, bool normalize, int64_t first_token,
                           int64_t seq_len, int64_t sequences, float* sums, cudaStream_t stream) {
  const int64_t blocks = sequences * experts;
  if (blocks == 0) return;
  SY_CHECK_MSG(blocks <= INT32_MAX, "sequence_routing_sums: too many sequences x experts");
  sequence_routing_sums_kernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      probs, expert_ids, n, experts, k, normalize, first_token, seq_len, sums);
  SY_CUDA_CHECK_LAUNCH();
}

void sequence_aux_backward(const float* probs, const float* sums, int64_t n, int64_t experts,
                           bool normalize, int64_t first_token, int64_t seq_len, float scale,
                           float* dlogits, cudaStream_t stream) {
  if (n == 0) return;
  sequence_aux_backward_kernel<<<grid_blocks(n, kRowThreads), kRowThreads, 0, stream>>>(
      probs, sums, n, experts, normalize, first_token, seq_len, scale, dlogits);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
