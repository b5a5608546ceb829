#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// The tensors are cut into chunks of at most kChunk elements; block b updates chunk b
// (and every gridDim.x-th after it), so one launch covers any number of tensors.
constexpr int64_t kChunk = 1 << 16;

struct Factors {
  float step_size;
  float bias_correction2_sqrt;
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float grad_scale;
};

__global__ void adamw_kernel(const AdamWChunk* chunks, int64_t num_chunks, Factors f) {
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const AdamWChunk ch = chunks[c];
    auto* work = static_cast<__nv_bfloat16*>(ch.work);
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const float g = ch.grad[i] * f.grad_scale;
      const float m = f.beta1 * ch.exp_avg[i] + f.one_minus_beta1 * g;
      const float v = f.beta2 * ch.exp_avg_sq[i] + f.one_minus_beta2 * g * g;
      ch.exp_avg[i] = m;
      ch.exp_avg_sq[i] = v;
      const float denom = sqrtf(v) / f.bias_correction2_sqrt + f.eps;
      const float p = ch.param[i] * ch.decay - f.step_size * m / denom;
      ch.param[i] = p;
      if (work) work[i] = __float2bfloat16_rn(p);
    }
  }
}

}  // namespace

std::vector<AdamWChunk> adamw_chunks(const std::vector<AdamWTensor>& tensors, double lr,
                                     double weight_decay) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  std::vector<AdamWChunk> chunks;
  for (const AdamWTensor& t : tensors)
    for (int64_t begin = 0; begin < t.n; begin += kChunk)
      chunks.push_back(AdamWChunk{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.work, begin,
                                  std::min(t.n, begin + kChunk), t.decay ? decay : 1.0f});
  return chunks;
}

void adamw_step(const AdamWChunk* chunks, int64_t count, double lr, double beta1, double beta2,
                double eps, int64_t step, double grad_scale, cudaStream_t stream) {
  if (count == 0) return;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const Factors f{static_cast<float>(lr / bias_correction1),
                  static_cast<float>(std::sqrt(bias_correction2)),
                  static_cast<float>(beta1),
                  static_cast<float>(beta2),
                  static_cast<float>(1.0 - beta1),
                  static_cast<float>(1.0 - beta2),
                  static_cast<float>(eps),
                  static_cast<float>(grad_scale)};
  const unsigned int blocks = static_cast<unsigned int>(std::min<int64_t>(count, kMaxBlocks));
  adamw_kernel<<<blocks, kThreads, 0, stream>>>(chunks, count, f);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::cuda
