#include "kernels/rmsnorm.h"

#include "kernels/convert.h"
#include "kernels/cpu/rmsnorm.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/rmsnorm.h"
#endif

namespace switchyard {
namespace {

}  // namespace

void rmsnorm_forward(Device& dev, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                     Tensor& rstd) {
  SY_CHECK_MSG(
      is_float(x) && y.dtype() == x.dtype() && is_float(weight) && rstd.dtype() == DType::kF32,
      "rmsnorm_forward: x and y must be both f32 or both bf16, weight f32 or bf16, "
      "rstd f32");
  SY_CHECK_MSG(x.rank() >= 1, "rmsnorm_forward: x needs a last dimension");
  const int64_t dim = x.dim(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  SY_CHECK_MSG(weight.numel() == dim && y.shape() == x.shape() && rstd.numel() == rows,
               "rmsnorm_forward: shapes do not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "rmsnorm_forward", {&x, &weight, &y, &rstd});
    with_cuda_types(x, weight, [&](auto x_type, auto weight_type) {
      using T = typename decltype(x_type)::type;
      using W = typename decltype(weight_type)::type;
      cuda::rmsnorm_forward(cuda_data<T>(x), cuda_data<W>(weight), eps, rows, dim, cuda_data<T>(y),
                            rstd.data<float>(), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rmsnorm_forward: this build has no CUDA backend");
  if (any_bf16({&x, &weight})) {
    Tensor result = f32_result(y);
    rmsnorm_forward(dev, widened(x), widened(weight), eps, result, rstd);
    store(dev, result, y);
    return;
  }
  cpu::rmsnorm_forward<float>(x.data<float>(), weight.data<float>(), eps, rows, dim,
                              y.data<float>(), rstd.data<float>());
}

void rmsnorm_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  SY_CHECK_MSG(is_float(x) && dy.dtype() == x.dtype() && dx.dtype() == x.dtype() &&
                   is_float(weight) && rstd.dtype() == DType::kF32 &&
                   dweight.dtype() == DType::kF32,
               "rmsnorm_backward: dy, x and dx must be all f32 or all bf16, weight f32 or bf16, "
               "rstd and dweight f32");
  SY_CHECK_MSG(x.rank() >= 1, "rmsnorm_backward: x needs a last dimension");
  const int64_t dim = x.dim(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  SY_CHECK_MSG(dy.shape() == x.shape() && dx.shape() == x.shape() && weight.numel() == dim &&
                   dweight.numel() == dim && rstd.numel() == rows,
               "rmsnorm_backward: shapes do not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream =
        op_stream(dev, "rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
    with_cuda_types(x, weight, [&](auto x_type, auto weight_type) {
      using T = typename decltype(x_type)::type;
      using W = typename decltype(weight_type)::type;
      cuda::rmsnorm_backward(cuda_data<T>(dy), cuda_data<T>(x), cuda_data<W>(weight),
                             rstd.data<float>(), rows, dim, cuda_data<T>(dx), dweight.data<float>(),
                             stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rmsnorm_backward: this build has no CUDA backend");
  if (any_bf16({&x, &weight})) {
    Tensor dx_values = f32_result(dx);
    rmsnorm_backward(dev, widened(dy), widened(x), widened(weight), rstd, dx_values, dweight);
    store(dev, dx_values, dx);
    return;
  }
  cpu::rmsnorm_backward<float>(dy.data<float>(), x.data<float>(), weight.data<float>(),
                               rstd.data<float>(), rows, dim, dx.data<float>(),
                               dweight.data<float>());
}

}  // namespace switchyard
