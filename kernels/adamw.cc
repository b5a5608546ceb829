#include "kernels/adamw.h"

#include "kernels/cpu/adamw.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {

void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale, Tensor& param,
                const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq) {
  SY_CHECK_MSG(h.step >= 1, "adamw_step: step is 1-based");
  const int64_t n = param.numel();
  SY_CHECK_MSG(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n,
               "adamw_step: grad and moments must match param");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::adamw_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                     exp_avg_sq.data<float>(), n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                     h.step, grad_scale,
                     op_stream(dev, "adamw_step", {&param, &grad, &exp_avg, &exp_avg_sq}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "adamw_step: this build has no CUDA backend");
  cpu::adamw_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                  exp_avg_sq.data<float>(), n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                  h.step, grad_scale);
}

}  // namespace switchyard
