#include "kernels/swiglu.h"

#include "kernels/cpu/swiglu.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/swiglu.h"
#endif

namespace switchyard {

void swiglu_forward(Device& dev, const Tensor& gate_up, Tensor& out) {
  SY_CHECK_MSG(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
               "swiglu_forward: gate_up must be (rows, 2I)");
  const int64_t rows = gate_up.dim(0);
  const int64_t inter = gate_up.dim(1) / 2;
  SY_CHECK_MSG(out.shape() == Shape({rows, inter}), "swiglu_forward: out must be (rows, I)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::swiglu_forward(gate_up.data<float>(), out.data<float>(), rows, inter,
                         op_stream(dev, "swiglu_forward", {&gate_up, &out}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "swiglu_forward: this build has no CUDA backend");
  cpu::swiglu_forward(gate_up.data<float>(), out.data<float>(), rows, inter);
}

void swiglu_backward(Device& dev, const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) {
  SY_CHECK_MSG(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
               "swiglu_backward: gate_up must be (rows, 2I)");
  const int64_t rows = gate_up.dim(0);
  const int64_t inter = gate_up.dim(1) / 2;
  SY_CHECK_MSG(dout.shape() == Shape({rows, inter}), "swiglu_backward: dout must be (rows, I)");
  SY_CHECK_MSG(dgate_up.shape() == gate_up.shape(),
               "swiglu_backward: dgate_up must have the shape of gate_up");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::swiglu_backward(dout.data<float>(), gate_up.data<float>(), dgate_up.data<float>(), rows,
                          inter, op_stream(dev, "swiglu_backward", {&dout, &gate_up, &dgate_up}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "swiglu_backward: this build has no CUDA backend");
  cpu::swiglu_backward(dout.data<float>(), gate_up.data<float>(), dgate_up.data<float>(), rows,
                       inter);
}

}  // namespace switchyard
