#include "kernels/cuda/adamw.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

struct AdamWFactors {
  float decay;
  float step_size;
  float bias_correction2_sqrt;
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float grad_scale;
};

template <typename T>
__global__ void adamw_kernel(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                             AdamWFactors f) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = static_cast<float>(grad[i]) * f.grad_scale;
    const float m = f.beta1 * static_cast<float>(exp_avg[i]) + f.one_minus_beta1 * g;
    const float v = f.beta2 * static_cast<float>(exp_avg_sq[i]) + f.one_minus_beta2 * g * g;
    exp_avg[i] = static_cast<T>(m);
    exp_avg_sq[i] = static_cast<T>(v);
    const float denom = sqrtf(v) / f.bias_correction2_sqrt + f.eps;
    param[i] = static_cast<T>(static_cast<float>(param[i]) * f.decay - f.step_size * m / denom);
  }
}

}  // namespace

template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step,
                double grad_scale, cudaStream_t stream) {
  if (n == 0) return;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const AdamWFactors f{static_cast<float>(1.0 - lr * weight_decay),
                       static_cast<float>(lr / bias_correction1),
                       static_cast<float>(std::sqrt(bias_correction2)),
                       static_cast<float>(beta1),
                       static_cast<float>(beta2),
                       static_cast<float>(1.0 - beta1),
                       static_cast<float>(1.0 - beta2),
                       static_cast<float>(eps),
                       static_cast<float>(grad_scale)};
  adamw_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, f);
  SY_CUDA_CHECK_LAUNCH();
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double,
                                double, double, double, int64_t, double, cudaStream_t);

}  // namespace switchyard::cuda
