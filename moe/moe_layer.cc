#include "moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/gating.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "kernels/router_aux.h"
#include "kernels/swiglu.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}
}  // namespace

MoeLayer::MoeLayer(ParamStore& params, const std::string& prefix,
                   const config::ModelConfig& model, const config::MoeConfig& moe)
    : num_experts_(moe.num_experts()),
      top_k_(moe.top_k()),
      gating_(moe.gating()),
      capacity_factor_(moe.capacity_factor()) {
  const int64_t hidden = model.hidden_size();
  const int64_t ffn = moe.expert_ffn_hidden_size();
  const float std = model.init_std();
  router_ = &params.add(prefix + "gate.weight", {num_experts_, hidden}, ShardSpec{},
                        ParamInit::kNormal, std);
  gate_up_ = &params.add(prefix + "experts.gate_up_proj", {num_experts_, 2 * ffn, hidden},
                         ShardSpec{.expert = true}, ParamInit::kNormal, std);
  down_ = &params.add(prefix + "experts.down_proj", {num_experts_, hidden, ffn},
                      ShardSpec{.expert = true}, ParamInit::kNormal, std);
  if (moe.num_shared_experts() > 0) {
    shared_ = std::make_unique<SwigluFfn>(
        params, prefix + "shared_expert.", hidden,
        static_cast<int64_t>(moe.num_shared_experts()) * moe.shared_expert_ffn_hidden_size(), std);
    if (moe.shared_expert_gate())
      shared_gate_ = &params.add(prefix + "shared_expert_gate.weight", {1, hidden}, ShardSpec{},
                                 ParamInit::kNormal, std);
  }
}

Tensor MoeLayer::forward(Device& dev, const Tensor& x, bool training, Rng& rng,
                         RouterStats& stats) {
  const int64_t n = x.rows();
  const int64_t hidden = x.row_size();
  const int64_t ffn = down_->shape[2];
  const int E = num_experts_;
  x_ = x;

  // Router in fp32.
  router_logits_ = activation(dev, {n, E});
  matmul(dev, x, false, router_->value, true, router_logits_);
  probs_ = activation(dev, {n, E});
  expert_ids_ = activation(dev, {n, top_k_}, DType::kI32);
  weights_ = activation(dev, {n, top_k_});
  const bool renormalize = gating_ != config::SOFTMAX_TOPK;
  gating_forward(dev, router_logits_, top_k_, renormalize, probs_, expert_ids_, weights_);

  Tensor selections = activation(dev, {E});
  Tensor prob_sums = activation(dev, {E});
  routing_counts(dev, probs_, expert_ids_, selections, prob_sums);
  for (int e = 0; e < E; ++e) {
    stats.selections_per_expert[e] += selections.data<float>()[e];
    stats.prob_sum_per_expert[e] += prob_sums.data<float>()[e];
  }
  stats.routed_tokens += n;
  stats.z_loss += router_z_loss_forward(dev, router_logits_);

  // GShard: the second expert takes the token with probability min(1, 2 * weight); an
  // unsent assignment has expert id -1 in the dispatch plan (the gating backward keeps
  // the full top-2 selection).
  Tensor dispatch_ids = expert_ids_;
  if (gating_ == config::GSHARD_TOP2 && training) {
    dispatch_ids = activation(dev, {n, top_k_}, DType::kI32);
    dispatch_ids.copy_from(expert_ids_);
    int32_t* ids = dispatch_ids.data<int32_t>();
    const float* w = weights_.data<float>();
    for (int64_t t = 0; t < n; ++t)
      if (rng.uniform() >= 2.0 * w[t * 2 + 1]) ids[t * 2 + 1] = -1;
  }

  int64_t capacity = -1;
  if (capacity_factor_ > 0)
    capacity = static_cast<int64_t>(std::ceil(capacity_factor_ * n * top_k_ / E));
  tokens_per_expert_ = activation(dev, {E}, DType::kI32);
  dest_rows_ = activation(dev, {n, top_k_}, DType::kI32);
  permute_plan(dev, dispatch_ids, weights_, E, capacity, tokens_per_expert_, dest_rows_);

  int64_t rows = 0, max_rows = 0;
  for (int e = 0; e < E; ++e) {
    rows += tokens_per_expert_.data<int32_t>()[e];
    max_rows = std::max<int64_t>(max_rows, tokens_per_expert_.data<int32_t>()[e]);
  }
  stats.assignments += n * top_k_;
  stats.dropped_assignments += n * top_k_ - rows;
  if (rows > 0)
    stats.worst_load_ratio = std::max(stats.worst_load_ratio, static_cast<double>(max_rows) * E / rows);

  xp_ = activation(dev, {rows, hidden});
  permute_gather(dev, x, dest_rows_, xp_);
  gate_up_out_ = activation(dev, {rows, 2 * ffn});
  grouped_matmul_nt(dev, xp_, gate_up_->value, tokens_per_expert_, gate_up_out_);
  act_ = activation(dev, {rows, ffn});
  swiglu_forward(dev, gate_up_out_, act_);
  expert_out_ = activation(dev, {rows, hidden});
  grouped_matmul_nt(dev, act_, down_->value, tokens_per_expert_, expert_out_);
  Tensor y = activation(dev, {n, hidden});
  unpermute_combine(dev, expert_out_, dest_rows_, weights_, y);

  if (shared_) {
    shared_out_ = shared_->forward(dev, x);
    if (shared_gate_) {
      shared_gate_logit_ = activation(dev, {n, 1});
      matmul(dev, x, false, shared_gate_->value, true, shared_gate_logit_);
      sigmoid_gate_forward(dev, shared_out_, shared_gate_logit_, y);
    } else {
      add_(dev, y, shared_out_);
    }
  }
  return y;
}

Tensor MoeLayer::backward(Device& dev, const Tensor& dy, const Tensor& aux_prob_grad,
                          float z_loss_scale) {
  const int64_t n = dy.rows();
  const int64_t hidden = dy.row_size();
  const int64_t rows = xp_.rows();
  const int64_t ffn = down_->shape[2];
  const int E = num_experts_;
  Tensor dx = Tensor::zeros({n, hidden}, DType::kF32, MemoryKind::kActivations, dev);

  if (shared_) {
    Tensor dshared;
    if (shared_gate_) {
      dshared = activation(dev, {n, hidden});
      Tensor dgate_logit = activation(dev, {n, 1});
      sigmoid_gate_backward(dev, dy, shared_out_, shared_gate_logit_, dshared, dgate_logit);
      matmul(dev, dgate_logit, true, x_, false, shared_gate_->grad, 1.0f, 1.0f);
      matmul(dev, dgate_logit, false, shared_gate_->value, false, dx, 1.0f, 1.0f);
    } else {
      dshared = dy;
    }
    add_(dev, dx, shared_->backward(dev, dshared));
  }

  Tensor dexpert_out = activation(dev, {rows, hidden});
  Tensor dweights = activation(dev, {n, top_k_});
  unpermute_combine_backward(dev, dy, expert_out_, dest_rows_, weights_, dexpert_out, dweights);
  grouped_matmul_tn_accumulate(dev, dexpert_out, act_, tokens_per_expert_, down_->grad);
  Tensor dact = activation(dev, {rows, ffn});
  grouped_matmul_nn(dev, dexpert_out, down_->value, tokens_per_expert_, dact);
  Tensor dgate_up = activation(dev, {rows, 2 * ffn});
  swiglu_backward(dev, dact, gate_up_out_, dgate_up);
  grouped_matmul_tn_accumulate(dev, dgate_up, xp_, tokens_per_expert_, gate_up_->grad);
  Tensor dxp = activation(dev, {rows, hidden});
  grouped_matmul_nn(dev, dgate_up, gate_up_->value, tokens_per_expert_, dxp);
  permute_gather_backward(dev, dxp, dest_rows_, dx);

  Tensor dlogits = activation(dev, {n, E});
  const bool renormalize = gating_ != config::SOFTMAX_TOPK;
  gating_backward(dev, probs_, expert_ids_, dweights, renormalize, dlogits);
  if (z_loss_scale != 0.0f) router_z_loss_backward(dev, router_logits_, z_loss_scale, dlogits);
  aux_loss_backward(dev, probs_, aux_prob_grad, dlogits);
  matmul(dev, dlogits, true, x_, false, router_->grad, 1.0f, 1.0f);
  matmul(dev, dlogits, false, router_->value, false, dx, 1.0f, 1.0f);

  x_ = probs_ = router_logits_ = expert_ids_ = weights_ = Tensor();
  tokens_per_expert_ = dest_rows_ = xp_ = gate_up_out_ = act_ = expert_out_ = Tensor();
  shared_out_ = shared_gate_logit_ = Tensor();
  return dx;
}

}  // namespace switchyard
