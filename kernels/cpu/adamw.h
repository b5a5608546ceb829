// CPU AdamW step, in the operation order of torch.optim.AdamW (single-tensor path) so
// results match PyTorch to rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// One step over n elements. The scalar factors are formed in double, as PyTorch does
// from Python floats, then applied in T. step is 1-based.
template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step,
                double grad_scale) {
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T step_size = static_cast<T>(lr / bias_correction1);
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T b1 = static_cast<T>(beta1);
  const T b2 = static_cast<T>(beta2);
  const T one_minus_b1 = static_cast<T>(1.0 - beta1);
  const T one_minus_b2 = static_cast<T>(1.0 - beta2);
  const T eps_t = static_cast<T>(eps);
  const T scale = static_cast<T>(grad_scale);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * scale;
    const T m = b1 * exp_avg[i] + one_minus_b1 * g;
    const T v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T denom = std::sqrt(v) / bias_correction2_sqrt + eps_t;
    param[i] = param[i] * decay - step_size * m / denom;
  }
}

}  // namespace switchyard::cpu
