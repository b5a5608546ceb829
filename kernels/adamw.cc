#include "kernels/adamw.h"

#include "kernels/cpu/adamw.h"

namespace switchyard {

void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale, Tensor& param,
                const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq) {
  SY_CHECK_MSG(!dev.is_cuda(), "adamw_step: no CUDA implementation yet");
  SY_CHECK_MSG(h.step >= 1, "adamw_step: step is 1-based");
  const int64_t n = param.numel();
  SY_CHECK_MSG(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n,
               "adamw_step: grad and moments must match param");
  cpu::adamw_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                  exp_avg_sq.data<float>(), n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                  h.step, grad_scale);
}

}  // namespace switchyard
