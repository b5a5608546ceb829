#include "kernels/router_aux.h"

#include "kernels/cpu/router_aux.h"

namespace switchyard {

void routing_counts(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                    Tensor& selections, Tensor& prob_sums) {
  SY_CHECK_MSG(!dev.is_cuda(), "routing_counts: no CUDA implementation yet");
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(expert_ids.rank() == 2 && expert_ids.dim(0) == n);
  SY_CHECK(selections.numel() == experts && prob_sums.numel() == experts);
  cpu::routing_counts<float>(probs.data<float>(), expert_ids.data<int32_t>(), n, experts,
                             expert_ids.dim(1), selections.data<float>(),
                             prob_sums.data<float>());
}

void aux_loss_backward(Device& dev, const Tensor& probs, const Tensor& prob_grad,
                       Tensor& dlogits) {
  SY_CHECK_MSG(!dev.is_cuda(), "aux_loss_backward: no CUDA implementation yet");
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(prob_grad.numel() == experts && dlogits.numel() == n * experts);
  cpu::aux_loss_backward<float>(probs.data<float>(), prob_grad.data<float>(), n, experts,
                                dlogits.data<float>());
}

}  // namespace switchyard
