#include "kernels/router_aux.h"

#include "kernels/cpu/router_aux.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/router_aux.h"
#endif

namespace switchyard {

void routing_counts(Device& dev, const Tensor& probs, const Tensor& expert_ids, Tensor& selections,
                    Tensor& prob_sums) {
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(expert_ids.rank() == 2 && expert_ids.dim(0) == n);
  SY_CHECK(selections.numel() == experts && prob_sums.numel() == experts);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::routing_counts(
        probs.data<float>(), expert_ids.data<int32_t>(), n, experts, expert_ids.dim(1),
        selections.data<float>(), prob_sums.data<float>(),
        op_stream(dev, "routing_counts", {&probs, &expert_ids, &selections, &prob_sums}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "routing_counts: this build has no CUDA backend");
  cpu::routing_counts<float>(probs.data<float>(), expert_ids.data<int32_t>(), n, experts,
                             expert_ids.dim(1), selections.data<float>(),
                             prob_sums.data<float>());
}

void aux_loss_backward(Device& dev, const Tensor& probs, const Tensor& prob_grad, Tensor& dlogits) {
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(prob_grad.numel() == experts && dlogits.numel() == n * experts);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::aux_loss_backward(probs.data<float>(), prob_grad.data<float>(), n, experts,
                            dlogits.data<float>(),
                            op_stream(dev, "aux_loss_backward", {&probs, &prob_grad, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "aux_loss_backward: this build has no CUDA backend");
  cpu::aux_loss_backward<float>(probs.data<float>(), prob_grad.data<float>(), n, experts,
                                dlogits.data<float>());
}

}  // namespace switchyard
