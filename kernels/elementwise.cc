#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/elementwise.h"
#endif

namespace switchyard {

void add_(Device& dev, Tensor& y, const Tensor& x, float alpha) {
  SY_CHECK_MSG(x.numel() == y.numel(), "add_: x and y must have the same number of elements");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::add(y.data<float>(), x.data<float>(), alpha, y.numel(), op_stream(dev, "add_", {&y, &x}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "add_: this build has no CUDA backend");
  cpu::add(y.data<float>(), x.data<float>(), alpha, y.numel());
}

void scale_(Device& dev, Tensor& x, float alpha) {
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::scale(x.data<float>(), alpha, x.numel(), op_stream(dev, "scale_", {&x}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "scale_: this build has no CUDA backend");
  cpu::scale(x.data<float>(), alpha, x.numel());
}

void add_bias_(Device& dev, Tensor& y, const Tensor& bias) {
  SY_CHECK_MSG(y.rank() == 2, "add_bias_: y must be (rows, n)");
  SY_CHECK_MSG(bias.shape() == Shape({y.dim(1)}), "add_bias_: bias must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::add_bias(y.data<float>(), bias.data<float>(), y.dim(0), y.dim(1),
                   op_stream(dev, "add_bias_", {&y, &bias}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "add_bias_: this build has no CUDA backend");
  cpu::add_bias(y.data<float>(), bias.data<float>(), y.dim(0), y.dim(1));
}

void bias_backward(Device& dev, const Tensor& dy, Tensor& dbias) {
  SY_CHECK_MSG(dy.rank() == 2, "bias_backward: dy must be (rows, n)");
  SY_CHECK_MSG(dbias.shape() == Shape({dy.dim(1)}), "bias_backward: dbias must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::bias_backward(dy.data<float>(), dbias.data<float>(), dy.dim(0), dy.dim(1),
                        op_stream(dev, "bias_backward", {&dy, &dbias}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "bias_backward: this build has no CUDA backend");
  cpu::bias_backward(dy.data<float>(), dbias.data<float>(), dy.dim(0), dy.dim(1));
}

double sum_squares(Device& dev, const Tensor& x) {
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda())
    return cuda::sum_squares(x.data<float>(), x.numel(), op_stream(dev, "sum_squares", {&x}));
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sum_squares: this build has no CUDA backend");
  return cpu::sum_squares(x.data<float>(), x.numel());
}

void sigmoid_gate_forward(Device& dev, const Tensor& x, const Tensor& g, Tensor& y) {
  SY_CHECK_MSG(x.rank() == 2, "sigmoid_gate_forward: x must be (rows, n)");
  SY_CHECK_MSG(y.shape() == x.shape(), "sigmoid_gate_forward: y must have the shape of x");
  SY_CHECK_MSG(g.shape() == Shape({x.dim(0), 1}), "sigmoid_gate_forward: g must be (rows, 1)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sigmoid_gate_forward(x.data<float>(), g.data<float>(), y.data<float>(), x.dim(0),
                               x.dim(1), op_stream(dev, "sigmoid_gate_forward", {&x, &g, &y}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gate_forward: this build has no CUDA backend");
  cpu::sigmoid_gate_forward(x.data<float>(), g.data<float>(), y.data<float>(), x.dim(0), x.dim(1));
}

void sigmoid_gate_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& g,
                           Tensor& dx, Tensor& dg) {
  SY_CHECK_MSG(x.rank() == 2, "sigmoid_gate_backward: x must be (rows, n)");
  SY_CHECK_MSG(dy.shape() == x.shape(), "sigmoid_gate_backward: dy must have the shape of x");
  SY_CHECK_MSG(dx.shape() == x.shape(), "sigmoid_gate_backward: dx must have the shape of x");
  SY_CHECK_MSG(g.shape() == Shape({x.dim(0), 1}), "sigmoid_gate_backward: g must be (rows, 1)");
  SY_CHECK_MSG(dg.shape() == g.shape(), "sigmoid_gate_backward: dg must be (rows, 1)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sigmoid_gate_backward(dy.data<float>(), x.data<float>(), g.data<float>(),
                                dx.data<float>(), dg.data<float>(), x.dim(0), x.dim(1),
                                op_stream(dev, "sigmoid_gate_backward", {&dy, &x, &g, &dx, &dg}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gate_backward: this build has no CUDA backend");
  cpu::sigmoid_gate_backward(dy.data<float>(), x.data<float>(), g.data<float>(), dx.data<float>(),
                             dg.data<float>(), x.dim(0), x.dim(1));
}

}  // namespace switchyard
