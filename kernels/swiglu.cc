#include "kernels/swiglu.h"

#include <initializer_list>

#include "kernels/convert.h"
#include "kernels/cpu/swiglu.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/swiglu.h"
#endif

namespace switchyard {
namespace {

// The operands share one dtype, f32 or bf16.
bool same_float_type(std::initializer_list<const Tensor*> tensors) {
  const DType dtype = (*tensors.begin())->dtype();
  if (dtype != DType::kF32 && dtype != DType::kBF16) return false;
  for (const Tensor* t : tensors)
    if (t->dtype() != dtype) return false;
  return true;
}

}  // namespace

void swiglu_forward(Device& dev, const Tensor& gate_up, Tensor& out) {
  SY_CHECK_MSG(same_float_type({&gate_up, &out}),
               "swiglu_forward: gate_up and out must be both f32 or both bf16");
  SY_CHECK_MSG(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
               "swiglu_forward: gate_up must be (rows, 2I)");
  const int64_t rows = gate_up.dim(0);
  const int64_t inter = gate_up.dim(1) / 2;
  SY_CHECK_MSG(out.shape() == Shape({rows, inter}), "swiglu_forward: out must be (rows, I)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "swiglu_forward", {&gate_up, &out});
    with_cuda_type(gate_up, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::swiglu_forward(cuda_data<T>(gate_up), cuda_data<T>(out), rows, inter, stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "swiglu_forward: this build has no CUDA backend");
  if (any_bf16({&gate_up})) {
    Tensor result = f32_result(out);
    swiglu_forward(dev, widened(gate_up), result);
    store(dev, result, out);
    return;
  }
  cpu::swiglu_forward(gate_up.data<float>(), out.data<float>(), rows, inter);
}

void swiglu_backward(Device& dev, const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) {
  SY_CHECK_MSG(same_float_type({&dout, &gate_up, &dgate_up}),
               "swiglu_backward: dout, gate_up and dgate_up must be all f32 or all bf16");
  SY_CHECK_MSG(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
               "swiglu_backward: gate_up must be (rows, 2I)");
  const int64_t rows = gate_up.dim(0);
  const int64_t inter = gate_up.dim(1) / 2;
  SY_CHECK_MSG(dout.shape() == Shape({rows, inter}), "swiglu_backward: dout must be (rows, I)");
  SY_CHECK_MSG(dgate_up.shape() == gate_up.shape(),
               "swiglu_backward: dgate_up must have the shape of gate_up");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "swiglu_backward", {&dout, &gate_up, &dgate_up});
    with_cuda_type(gate_up, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::swiglu_backward(cuda_data<T>(dout), cuda_data<T>(gate_up), cuda_data<T>(dgate_up), rows,
                            inter, stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "swiglu_backward: this build has no CUDA backend");
  if (any_bf16({&gate_up})) {
    Tensor result = f32_result(dgate_up);
    swiglu_backward(dev, widened(dout), widened(gate_up), result);
    store(dev, result, dgate_up);
    return;
  }
  cpu::swiglu_backward(dout.data<float>(), gate_up.data<float>(), dgate_up.data<float>(), rows,
                       inter);
}

}  // namespace switchyard
