#include "kernels/rmsnorm.h"

#include "kernels/cpu/rmsnorm.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/rmsnorm.h"
#endif

namespace switchyard {

void rmsnorm_forward(Device& dev, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                     Tensor& rstd) {
  SY_CHECK_MSG(x.rank() >= 1, "rmsnorm_forward: x needs a last dimension");
  const int64_t dim = x.dim(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  SY_CHECK_MSG(weight.numel() == dim && y.shape() == x.shape() && rstd.numel() == rows,
               "rmsnorm_forward: shapes do not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::rmsnorm_forward<float>(x.data<float>(), weight.data<float>(), eps, rows, dim,
                                 y.data<float>(), rstd.data<float>(),
                                 op_stream(dev, "rmsnorm_forward", {&x, &weight, &y, &rstd}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rmsnorm_forward: this build has no CUDA backend");
  cpu::rmsnorm_forward<float>(x.data<float>(), weight.data<float>(), eps, rows, dim,
                              y.data<float>(), rstd.data<float>());
}

void rmsnorm_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  SY_CHECK_MSG(x.rank() >= 1, "rmsnorm_backward: x needs a last dimension");
  const int64_t dim = x.dim(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  SY_CHECK_MSG(dy.shape() == x.shape() && dx.shape() == x.shape() && weight.numel() == dim &&
                   dweight.numel() == dim && rstd.numel() == rows,
               "rmsnorm_backward: shapes do not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::rmsnorm_backward<float>(
        dy.data<float>(), x.data<float>(), weight.data<float>(), rstd.data<float>(), rows, dim,
        dx.data<float>(), dweight.data<float>(),
        op_stream(dev, "rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rmsnorm_backward: this build has no CUDA backend");
  cpu::rmsnorm_backward<float>(dy.data<float>(), x.data<float>(), weight.data<float>(),
                               rstd.data<float>(), rows, dim, dx.data<float>(),
                               dweight.data<float>());
}

}  // namespace switchyard
