#include "kernels/adamw.h"

#include "kernels/convert.h"
#include "kernels/cpu/adamw.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {

void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale, Tensor& param,
                const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq) {
  adamw_step(dev, h, grad_scale, {AdamWUpdate{&param, &grad, &exp_avg, &exp_avg_sq, true}});
}

void adamw_step(Device& dev, const AdamWHyper& h, float grad_scale,
                const std::vector<AdamWUpdate>& updates) {
  SY_CHECK_MSG(h.step >= 1, "adamw_step: step is 1-based");
  for (const AdamWUpdate& u : updates) {
    const int64_t n = u.param->numel();
    SY_CHECK_MSG(u.param->dtype() == DType::kF32 && u.grad->dtype() == DType::kF32 &&
                     u.exp_avg->dtype() == DType::kF32 && u.exp_avg_sq->dtype() == DType::kF32,
                 "adamw_step: parameters, gradients and moments are f32");
    SY_CHECK_MSG(u.grad->numel() == n && u.exp_avg->numel() == n && u.exp_avg_sq->numel() == n,
                 "adamw_step: grad and moments must match param");
    SY_CHECK_MSG(!u.work || (u.work->dtype() == DType::kBF16 && u.work->numel() == n),
                 "adamw_step: a working copy is bf16 and matches param");
  }
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    std::vector<cuda::AdamWTensor> tensors;
    cudaStream_t stream = nullptr;
    for (const AdamWUpdate& u : updates) {
      stream = op_stream(dev, "adamw_step", {u.param, u.grad, u.exp_avg, u.exp_avg_sq});
      if (u.work) op_stream(dev, "adamw_step", {u.work});
      tensors.push_back(cuda::AdamWTensor{u.param->data<float>(), u.grad->data<float>(),
                                          u.exp_avg->data<float>(), u.exp_avg_sq->data<float>(),
                                          u.work ? u.work->raw_data() : nullptr, u.param->numel(),
                                          u.decay});
    }
    const std::vector<cuda::AdamWChunk> chunks = cuda::adamw_chunks(tensors, h.lr, h.weight_decay);
    if (chunks.empty()) return;
    // The work list reaches the device through its copy from the host (one wait per step).
    const size_t bytes = chunks.size() * sizeof(cuda::AdamWChunk);
    Tensor table = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, MemoryKind::kOther, dev);
    dev.copy_from_host(table.raw_data(), chunks.data(), bytes);
    cuda::adamw_step(static_cast<const cuda::AdamWChunk*>(table.raw_data()),
                     static_cast<int64_t>(chunks.size()), h.lr, h.beta1, h.beta2, h.eps, h.step,
                     grad_scale, stream);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "adamw_step: this build has no CUDA backend");
  for (const AdamWUpdate& u : updates) {
    cpu::adamw_step(u.param->data<float>(), u.grad->data<float>(), u.exp_avg->data<float>(),
                    u.exp_avg_sq->data<float>(), u.param->numel(), h.lr, h.beta1, h.beta2, h.eps,
                    u.decay ? h.weight_decay : 0.0f, h.step, grad_scale);
    if (u.work) convert(dev, *u.param, *u.work);
  }
}

}  // namespace switchyard
