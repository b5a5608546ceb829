#include "kernels/gating.h"

#include "core/runtime/rng.h"
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

namespace {
// What every router forward records in sums (2E + 1): the selections per expert and the
// column sums of `probs` (routing_counts), then the z-loss sum of `logits`.
void record_routing_sums(Device& dev, const Tensor& logits, const Tensor& probs,
                         const Tensor& expert_ids, Tensor& sums) {
  const int64_t num_experts = logits.dim(1);
  const Tensor flat = sums.reshape({2 * num_experts + 1, 1});
  Tensor selections = flat.slice_rows(0, num_experts).reshape({num_experts});
  Tensor prob_sums = flat.slice_rows(num_experts, 2 * num_experts).reshape({num_experts});
  Tensor z_sum = flat.slice_rows(2 * num_experts, 2 * num_experts + 1).reshape({1});
  routing_counts(dev, probs, expert_ids, selections, prob_sums);
  router_z_loss_sum(dev, logits, z_sum);
}
}  // namespace

void router_forward(Device& dev, const Tensor& logits, int k, bool renormalize, Tensor& probs,
                    Tensor& expert_ids, Tensor& weights, Tensor& sums) {
  SY_CHECK_MSG(logits.rank() == 2, "router_forward: logits must be (n, E)");
  const int64_t num_experts = logits.dim(1);
  SY_CHECK_MSG(sums.numel() == 2 * num_experts + 1 && sums.dtype() == DType::kF32,
               "router_forward: sums must be (2 E + 1) f32");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda() && num_experts <= cuda::kFusedRouterMaxExperts) {
    const int64_t n = logits.dim(0);
    SY_CHECK_MSG(num_experts > 0 && k >= 1 && k <= num_experts,
                 "router_forward: k must be in [1, E]");
    SY_CHECK_MSG(probs.shape() == logits.shape(), "router_forward: probs must be (n, E)");
    SY_CHECK_MSG(expert_ids.shape() == Shape({n, k}) && weights.shape() == Shape({n, k}),
                 "router_forward: expert_ids and weights must be (n, k)");
    cuda::router_forward(
        logits.data<float>(), probs.data<float>(), expert_ids.data<int32_t>(),
        weights.data<float>(), sums.data<float>(), n, num_experts, k, renormalize,
        op_stream(dev, "router_forward", {&logits, &probs, &expert_ids, &weights, &sums}));
    return;
  }
#endif
  gating_forward(dev, logits, k, renormalize, probs, expert_ids, weights);
  record_routing_sums(dev, logits, probs, expert_ids, sums);
}

void gshard_dispatch_ids(Device& dev, const Tensor& expert_ids, const Tensor& weights,
                         uint64_t seed, uint64_t first_draw, Tensor& dispatch_ids) {
  SY_CHECK_MSG(
      expert_ids.rank() == 2 && expert_ids.dim(1) == 2 && expert_ids.dtype() == DType::kI32,
      "gshard_dispatch_ids: expert_ids must be i32 (n, 2)");
  SY_CHECK_MSG(weights.shape() == expert_ids.shape() && weights.dtype() == DType::kF32,
               "gshard_dispatch_ids: weights must be f32 (n, 2)");
  SY_CHECK_MSG(dispatch_ids.shape() == expert_ids.shape() && dispatch_ids.dtype() == DType::kI32,
               "gshard_dispatch_ids: dispatch_ids must be i32 (n, 2)");
  const int64_t n = expert_ids.dim(0);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::gshard_dispatch_ids(
        expert_ids.data<int32_t>(), weights.data<float>(), n, seed, first_draw,
        dispatch_ids.data<int32_t>(),
        op_stream(dev, "gshard_dispatch_ids", {&expert_ids, &weights, &dispatch_ids}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "gshard_dispatch_ids: this build has no CUDA backend");
  const int32_t* ids = expert_ids.data<int32_t>();
  const float* w = weights.data<float>();
  int32_t* out = dispatch_ids.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    out[2 * t] = ids[2 * t];
    const bool sent = Rng::uniform_at(seed, first_draw + static_cast<uint64_t>(t)) <
                      2.0 * static_cast<double>(w[2 * t + 1]);
    out[2 * t + 1] = sent ? ids[2 * t + 1] : -1;
  }
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

namespace {
void check_sigmoid_gating(const Tensor& logits, const Tensor& bias, const SigmoidGating& g) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dtype() == DType::kF32,
               "sigmoid gating: logits must be f32 (n, E)");
  const int64_t num_experts = logits.dim(1);
  SY_CHECK_MSG(bias.shape() == Shape({num_experts}) && bias.dtype() == DType::kF32,
               "sigmoid gating: bias must be f32 (E)");
  SY_CHECK_MSG(g.num_groups >= 1 && g.num_groups <= kMaxExpertGroups &&
                   num_experts % g.num_groups == 0,
               "sigmoid gating: num_groups must divide E and be at most kMaxExpertGroups");
  SY_CHECK_MSG(g.top_groups >= 1 && g.top_groups <= g.num_groups,
               "sigmoid gating: top_groups must be in [1, num_groups]");
  SY_CHECK_MSG(g.k >= 1 && g.k <= num_experts / g.num_groups * g.top_groups,
               "sigmoid gating: k must be in [1, the experts of the top groups]");
}
}  // namespace

void sigmoid_gating_forward(Device& dev, const Tensor& logits, const Tensor& bias,
                            const SigmoidGating& g, Tensor& scores, Tensor& expert_ids,
                            Tensor& weights) {
  check_sigmoid_gating(logits, bias, g);
  const int64_t n = logits.dim(0);
  const int64_t num_experts = logits.dim(1);
  SY_CHECK_MSG(scores.shape() == logits.shape(), "sigmoid_gating_forward: scores must be (n, E)");
  SY_CHECK_MSG(expert_ids.shape() == Shape({n, g.k}) && weights.shape() == Shape({n, g.k}),
               "sigmoid_gating_forward: expert_ids and weights must be (n, k)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sigmoid_gating_forward(
        logits.data<float>(), bias.data<float>(), scores.data<float>(),
        expert_ids.data<int32_t>(), weights.data<float>(), n, num_experts, g,
        op_stream(dev, "sigmoid_gating_forward", {&logits, &bias, &scores, &expert_ids, &weights}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gating_forward: this build has no CUDA backend");
  cpu::sigmoid_gating_forward(logits.data<float>(), bias.data<float>(), scores.data<float>(),
                              expert_ids.data<int32_t>(), weights.data<float>(), n, num_experts, g);
}

void sigmoid_router_forward(Device& dev, const Tensor& logits, const Tensor& bias,
                            const SigmoidGating& g, Tensor& scores, Tensor& expert_ids,
                            Tensor& weights, Tensor& sums) {
  SY_CHECK_MSG(logits.rank() == 2, "sigmoid_router_forward: logits must be (n, E)");
  const int64_t num_experts = logits.dim(1);
  SY_CHECK_MSG(sums.numel() == 2 * num_experts + 1 && sums.dtype() == DType::kF32,
               "sigmoid_router_forward: sums must be (2 E + 1) f32");
  sigmoid_gating_forward(dev, logits, bias, g, scores, expert_ids, weights);
  record_routing_sums(dev, logits, scores, expert_ids, sums);
}

void sigmoid_gating_backward(Device& dev, const Tensor& scores, const Tensor& expert_ids,
                             const Tensor& dweights, const SigmoidGating& g, Tensor& dlogits) {
  SY_CHECK_MSG(scores.rank() == 2, "sigmoid_gating_backward: scores must be (n, E)");
  const int64_t n = scores.dim(0);
  const int64_t num_experts = scores.dim(1);
  SY_CHECK_MSG(g.k >= 1 && g.k <= num_experts, "sigmoid_gating_backward: k must be in [1, E]");
  SY_CHECK_MSG(expert_ids.shape() == Shape({n, g.k}) && dweights.shape() == Shape({n, g.k}),
               "sigmoid_gating_backward: expert_ids and dweights must be (n, k)");
  SY_CHECK_MSG(dlogits.shape() == scores.shape(), "sigmoid_gating_backward: dlogits must be (n, E)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sigmoid_gating_backward(
        scores.data<float>(), expert_ids.data<int32_t>(), dweights.data<float>(),
        dlogits.data<float>(), n, num_experts, g,
        op_stream(dev, "sigmoid_gating_backward", {&scores, &expert_ids, &dweights, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gating_backward: this build has no CUDA backend");
  cpu::sigmoid_gating_backward(scores.data<float>(), expert_ids.data<int32_t>(),
                               dweights.data<float>(), dlogits.data<float>(), n, num_experts, g);
}

void round_robin_routing(Device& dev, int64_t first_token, int num_experts, Tensor& expert_ids,
                         Tensor& weights) {
  SY_CHECK_MSG(expert_ids.rank() == 2 && expert_ids.dtype() == DType::kI32,
               "round_robin_routing: expert_ids must be i32 (n, k)");
  SY_CHECK_MSG(weights.shape() == expert_ids.shape() && weights.dtype() == DType::kF32,
               "round_robin_routing: weights must be f32 (n, k)");
  const int64_t n = expert_ids.dim(0);
  const int k = static_cast<int>(expert_ids.dim(1));
  SY_CHECK_MSG(num_experts >= k && first_token >= 0,
               "round_robin_routing: k must be at most the experts");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::round_robin_routing(first_token, expert_ids.data<int32_t>(), weights.data<float>(), n,
                              num_experts, k,
                              op_stream(dev, "round_robin_routing", {&expert_ids, &weights}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "round_robin_routing: this build has no CUDA backend");
  cpu::round_robin_routing(first_token, expert_ids.data<int32_t>(), weights.data<float>(), n,
                           num_experts, k);
}

void expert_choice_forward(Device& dev, const Tensor& probs, int64_t capacity, Tensor& expert_ids,
                           Tensor& weights) {
  SY_CHECK_MSG(probs.rank() == 2 && probs.dtype() == DType::kF32,
               "expert_choice_forward: probs must be f32 (n, E)");
  SY_CHECK_MSG(expert_ids.shape() == probs.shape() && expert_ids.dtype() == DType::kI32,
               "expert_choice_forward: expert_ids must be i32 (n, E)");
  SY_CHECK_MSG(weights.shape() == probs.shape() && weights.dtype() == DType::kF32,
               "expert_choice_forward: weights must be f32 (n, E)");
  SY_CHECK_MSG(capacity >= 1, "expert_choice_forward: capacity must be >= 1");
  const int64_t n = probs.dim(0), num_experts = probs.dim(1);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::expert_choice_forward(
        probs.data<float>(), expert_ids.data<int32_t>(), weights.data<float>(), n, num_experts,
        capacity, op_stream(dev, "expert_choice_forward", {&probs, &expert_ids, &weights}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "expert_choice_forward: this build has no CUDA backend");
  cpu::expert_choice_forward(probs.data<float>(), expert_ids.data<int32_t>(), weights.data<float>(),
                             n, num_experts, capacity);
}

void expert_choice_router_forward(Device& dev, const Tensor& logits, int64_t capacity,
                                  Tensor& probs, Tensor& expert_ids, Tensor& weights,
                                  Tensor& sums) {
  SY_CHECK_MSG(logits.rank() == 2, "expert_choice_router_forward: logits must be (n, E)");
  const int64_t n = logits.dim(0), num_experts = logits.dim(1);
  SY_CHECK_MSG(sums.numel() == 2 * num_experts + 1 && sums.dtype() == DType::kF32,
               "expert_choice_router_forward: sums must be (2 E + 1) f32");
  // The softmax, through the top-1 gating whose choice is not used.
  Tensor top1_ids = Tensor::empty({n, 1}, DType::kI32, MemoryKind::kActivations, dev);
  Tensor top1_weights = Tensor::empty({n, 1}, DType::kF32, MemoryKind::kActivations, dev);
  gating_forward(dev, logits, 1, false, probs, top1_ids, top1_weights);
  expert_choice_forward(dev, probs, capacity, expert_ids, weights);
  record_routing_sums(dev, logits, probs, expert_ids, sums);
}

void expert_choice_backward(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                            const Tensor& dweights, Tensor& dlogits) {
  SY_CHECK_MSG(probs.rank() == 2, "expert_choice_backward: probs must be (n, E)");
  SY_CHECK_MSG(expert_ids.shape() == probs.shape() && dweights.shape() == probs.shape() &&
                   dlogits.shape() == probs.shape(),
               "expert_choice_backward: expert_ids, dweights and dlogits must be (n, E)");
  const int64_t n = probs.dim(0), num_experts = probs.dim(1);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::expert_choice_backward(
        probs.data<float>(), expert_ids.data<int32_t>(), dweights.data<float>(),
        dlogits.data<float>(), n, num_experts,
        op_stream(dev, "expert_choice_backward", {&probs, &expert_ids, &dweights, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "expert_choice_backward: this build has no CUDA backend");
  cpu::expert_choice_backward(probs.data<float>(), expert_ids.data<int32_t>(),
                              dweights.data<float>(), dlogits.data<float>(), n, num_experts);
}

void router_z_loss_sum(Device& dev, const Tensor& logits, Tensor& z_sum) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dim(1) > 0, "router_z_loss_sum: logits must be (n, E)");
  SY_CHECK_MSG(z_sum.numel() == 1 && z_sum.dtype() == DType::kF32,
               "router_z_loss_sum: z_sum must be one f32");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::router_z_loss_sum(logits.data<float>(), logits.dim(0), logits.dim(1), z_sum.data<float>(),
                            op_stream(dev, "router_z_loss_sum", {&logits, &z_sum}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "router_z_loss_sum: this build has no CUDA backend");
  *z_sum.data<float>() = static_cast<float>(
      cpu::router_z_loss_sum(logits.data<float>(), logits.dim(0), logits.dim(1)));
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
