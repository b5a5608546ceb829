#include "kernels/gating.h"

#include "kernels/cpu/gating.h"
#include "kernels/router_aux.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gating.h"
#endif

namespace switchyard {

void gating_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                    Tensor& expert_ids, Tensor& weights) {
  SY_CHECK_MSG(logits.rank() == 2, "gating_forward: logits must be (n, E)");
  const int64_t n = logits.dim(0);
  const int64_t num_experts = logits.dim(1);
  SY_CHECK_MSG(k >= 1 && k <= num_experts, "gating_forward: k must be in [1, E]");
  SY_CHECK_MSG(probs.shape() == logits.shape(), "gating_forward: probs must be (n, E)");
  SY_CHECK_MSG(expert_ids.shape() == Shape({n, k}), "gating_forward: expert_ids must be (n, k)");
  SY_CHECK_MSG(weights.shape() == Shape({n, k}), "gating_forward: weights must be (n, k)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::gating_forward(
        logits.data<float>(), probs.data<float>(), expert_ids.data<int32_t>(),
        weights.data<float>(), n, num_experts, k, renormalize,
        op_stream(dev, "gating_forward", {&logits, &probs, &expert_ids, &weights}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "gating_forward: this build has no CUDA backend");
  cpu::gating_forward(logits.data<float>(), probs.data<float>(), expert_ids.data<int32_t>(),
                      weights.data<float>(), n, num_experts, k, renormalize);
}

double router_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                      Tensor& expert_ids, Tensor& weights, Tensor& selections, Tensor& prob_sums) {
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda() && logits.rank() == 2 && logits.dim(1) <= cuda::kFusedRouterMaxExperts) {
    const int64_t n = logits.dim(0);
    const int64_t num_experts = logits.dim(1);
    SY_CHECK_MSG(num_experts > 0 && k >= 1 && k <= num_experts,
                 "router_forward: k must be in [1, E]");
    SY_CHECK_MSG(probs.shape() == logits.shape(), "router_forward: probs must be (n, E)");
    SY_CHECK_MSG(expert_ids.shape() == Shape({n, k}) && weights.shape() == Shape({n, k}),
                 "router_forward: expert_ids and weights must be (n, k)");
    SY_CHECK_MSG(selections.numel() == num_experts && prob_sums.numel() == num_experts,
                 "router_forward: selections and prob_sums must be (E)");
    return cuda::router_forward(
        logits.data<float>(), probs.data<float>(), expert_ids.data<int32_t>(),
        weights.data<float>(), selections.data<float>(), prob_sums.data<float>(), n,
        num_experts, k, renormalize,
        op_stream(dev, "router_forward",
                  {&logits, &probs, &expert_ids, &weights, &selections, &prob_sums}));
  }
#endif
  gating_forward(dev, logits, k, renormalize, probs, expert_ids, weights);
  routing_counts(dev, probs, expert_ids, selections, prob_sums);
  return router_z_loss_forward(dev, logits);
}

void gating_backward(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                     const Tensor& dweights, bool renormalize, Tensor& dlogits) {
  SY_CHECK_MSG(probs.rank() == 2, "gating_backward: probs must be (n, E)");
  const int64_t n = probs.dim(0);
  const int64_t num_experts = probs.dim(1);
  SY_CHECK_MSG(expert_ids.rank() == 2 && expert_ids.dim(0) == n,
               "gating_backward: expert_ids must be (n, k)");
  const int64_t k = expert_ids.dim(1);
  SY_CHECK_MSG(k >= 1 && k <= num_experts, "gating_backward: k must be in [1, E]");
  SY_CHECK_MSG(dweights.shape() == expert_ids.shape(), "gating_backward: dweights must be (n, k)");
  SY_CHECK_MSG(dlogits.shape() == probs.shape(), "gating_backward: dlogits must be (n, E)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::gating_backward(
        probs.data<float>(), expert_ids.data<int32_t>(), dweights.data<float>(),
        dlogits.data<float>(), n, num_experts, static_cast<int>(k), renormalize,
        op_stream(dev, "gating_backward", {&probs, &expert_ids, &dweights, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "gating_backward: this build has no CUDA backend");
  cpu::gating_backward(probs.data<float>(), expert_ids.data<int32_t>(), dweights.data<float>(),
                       dlogits.data<float>(), n, num_experts, static_cast<int>(k), renormalize);
}

double router_z_loss_forward(Device& dev, const Tensor& logits) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dim(1) > 0,
               "router_z_loss_forward: logits must be (n, E)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda())
    return cuda::router_z_loss_forward(logits.data<float>(), logits.dim(0), logits.dim(1),
                                       op_stream(dev, "router_z_loss_forward", {&logits}));
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "router_z_loss_forward: this build has no CUDA backend");
  return cpu::router_z_loss_forward(logits.data<float>(), logits.dim(0), logits.dim(1));
}

void router_z_loss_backward(Device& dev, const Tensor& logits, float scale, Tensor& dlogits) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dim(1) > 0,
               "router_z_loss_backward: logits must be (n, E)");
  SY_CHECK_MSG(dlogits.shape() == logits.shape(),
               "router_z_loss_backward: dlogits must have the shape of logits");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::router_z_loss_backward(logits.data<float>(), scale, dlogits.data<float>(), logits.dim(0),
                                 logits.dim(1),
                                 op_stream(dev, "router_z_loss_backward", {&logits, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "router_z_loss_backward: this build has no CUDA backend");
  cpu::router_z_loss_backward(logits.data<float>(), scale, dlogits.data<float>(), logits.dim(0),
                              logits.dim(1));
}

}  // namespace switchyard
