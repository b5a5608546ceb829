#include "moe/moe_layer.h"

#include <utility>

#include "core/runtime/op_clock.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/exact_grad.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}

}  // namespace

MoeLayer::MoeLayer(ParamStore& params, const std::string& prefix,
                   const config::ModelConfig& model, const config::MoeConfig& moe,
                   Communicator* expert_parallel, Communicator* tensor_parallel)
    : num_experts_(moe.num_experts()),
      num_local_experts_(moe.num_experts() / (expert_parallel ? expert_parallel->size() : 1)),
      ep_(expert_parallel && expert_parallel->size() > 1 ? expert_parallel : nullptr),
      tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr),
      top_k_(moe.top_k()),
      sequence_aux_(moe.seq_aux_loss_coef() > 0),
      capacity_factor_(moe.capacity_factor()),
      router_(params, prefix, moe, model.hidden_size(), model.init_std(), tp_),
      dispatcher_(num_experts_, num_local_experts_, router_.slots(), top_k_, ep_, tp_,
                  params.placement().expert_order) {
  const int64_t hidden = model.hidden_size();
  const int64_t ffn = moe.expert_ffn_hidden_size();
  const float std = model.init_std();
  // This rank's shard of the experts: positions [rank * local, (rank + 1) * local) of the
  // expert order (ShardPlacement::expert_order), the E in order by default.
  gate_up_ = &params.add(prefix + "experts.gate_up_proj", {num_experts_, 2 * ffn, hidden},
                         ShardSpec{.expert = true}, ParamInit::kNormal, std);
  down_ = &params.add(prefix + "experts.down_proj", {num_experts_, hidden, ffn},
                      ShardSpec{.expert = true}, ParamInit::kNormal, std);
  SY_CHECK_MSG(gate_up_->shape[0] == num_local_experts_,
               "the parameter placement and the expert-parallel group disagree");
  if (moe.num_shared_experts() > 0) {
    shared_ = std::make_unique<SwigluFfn>(
        params, prefix + "shared_expert.", hidden,
        static_cast<int64_t>(moe.num_shared_experts()) * moe.shared_expert_ffn_hidden_size(), std,
        tp_);
    if (moe.shared_expert_gate())
      shared_gate_ = &params.add(prefix + "shared_expert_gate.weight", {1, hidden}, ShardSpec{},
                                 ParamInit::kNormal, std);
  }
}

Tensor MoeLayer::forward(Device& dev, const Tensor& x, bool training, Rng& rng,
                         RouterStats& stats, int64_t seq_len,
                         std::span<const int32_t> real_tokens) {
  return run(dev, x, training, rng, stats, capacity_factor_, sequence_aux_ ? seq_len : 0,
             PaddedWindows::of(real_tokens, seq_len));
}

Tensor MoeLayer::infer(Device& dev, const Tensor& x, RouterStats& stats) {
  Rng unused;
  return run(dev, x, /*training=*/false, unused, stats, /*capacity_factor=*/0, /*seq_len=*/0,
             {});
}

Tensor MoeLayer::run(Device& dev, const Tensor& x, bool training, Rng& rng, RouterStats& stats,
                     float capacity_factor, int64_t seq_len, PaddedWindows padding) {
  const OpScope scope(OpKind::kExperts, OpPass::kForward, dev);
  const int group = tp_ ? tp_->size() : 1;
  const int member = tp_ ? tp_->rank() : 0;
  const int64_t total = x.rows();
  SY_CHECK_MSG(total % group == 0, "MoE tokens do not split evenly over the tensor-parallel group");
  const int64_t n = total / group;
  SY_CHECK_MSG(padding.empty() ||
                   static_cast<int64_t>(padding.real_tokens.size()) * padding.window == total,
               "MoE real tokens do not describe the batch's sequences");
  const int64_t routed = padding.tokens(total);
  const int E = num_experts_;
  saved_.x_whole = x;
  saved_.x = group > 1 ? x.slice_rows(member * n, (member + 1) * n) : x;
  // This layer's routing sums (selections, probability sums, z-loss, kept assignments)
  // stay on the device until the forward's end (RouterStats::collect).
  Tensor row = stats.add_layer(routed, E, top_k_, capacity_factor).reshape({3 * E + 1, 1});
  Tensor sums = row.slice_rows(0, 2 * E + 1).reshape({2 * E + 1});
  Tensor kept = row.slice_rows(2 * E + 1, 3 * E + 1).reshape({E});
  router_.forward(dev, saved_.x, member * n, std::move(padding), capacity_factor, seq_len, stats,
                  sums);
  dispatcher_.plan(dev, router_.dispatch_ids(dev, training, rng, total), router_.weights(),
                   routed, router_.chooses_by_expert() ? 0 : capacity_factor);
  convert(dev, dispatcher_.tokens_per_expert(), kept);
  if (tp_) tp_->all_reduce_sum(row);
  saved_.xp = dispatcher_.dispatch(dev, saved_.x);
  Tensor y_mine = dispatcher_.combine(dev, experts_forward(dev), router_.weights());
  if (recompute_experts_) saved_.gate_up_out = saved_.act = Tensor();
  Tensor y = y_mine;
  if (tp_) {
    y = activation(dev, {total, x.row_size()}, x.dtype());
    tp_->all_gather(y_mine, y);
  }
  if (shared_) shared_forward(dev, x, y);
  return y;
}

void MoeLayer::shared_forward(Device& dev, const Tensor& x, Tensor& y) {
  const OpScope scope(OpKind::kSharedExperts, OpPass::kForward, dev);
  saved_.shared_out = shared_->forward(dev, x);
  if (!shared_gate_) {
    add_(dev, y, saved_.shared_out);
    return;
  }
  saved_.shared_gate_logit = activation(dev, {x.rows(), 1}, x.dtype());
  matmul(dev, x, false, shared_gate_->work, true, saved_.shared_gate_logit);
  sigmoid_gate_forward(dev, saved_.shared_out, saved_.shared_gate_logit, y);
}

Tensor MoeLayer::experts_forward(Device& dev) {
  experts_hidden(dev);
  Tensor out = activation(dev, saved_.xp.shape(), saved_.xp.dtype());
  grouped_matmul_nt(dev, saved_.act, down_->work, dispatcher_.local_counts(), out);
  return out;
}

void MoeLayer::experts_hidden(Device& dev) {
  const int64_t rows = saved_.xp.rows();
  const int64_t ffn = down_->shape[2];
  saved_.gate_up_out = activation(dev, {rows, 2 * ffn}, saved_.xp.dtype());
  grouped_matmul_nt(dev, saved_.xp, gate_up_->work, dispatcher_.local_counts(), saved_.gate_up_out);
  saved_.act = activation(dev, {rows, ffn}, saved_.xp.dtype());
  swiglu_forward(dev, saved_.gate_up_out, saved_.act);
}

void MoeLayer::expert_weight_grads(Device& dev, const Tensor& dout, const Tensor& dgate_up) {
  const Tensor& counts = dispatcher_.local_counts();
  if (!down_->ledger.defined() || !ep_ || ep_->size() == 1) {
    grouped_matmul_tn_accumulate(dev, dout, saved_.act, counts, down_->grad);
    grouped_matmul_tn_accumulate(dev, dgate_up, saved_.xp, counts, gate_up_->grad);
    return;
  }
  // One part per source rank: expert e's rows from source j follow those from sources
  // before j, and each group of rows goes through the product alone, as in one process.
  const int local = num_local_experts_;
  const std::vector<int64_t>& from = dispatcher_.received_by_source();
  std::vector<int64_t> next(local, 0);  // the next row of each expert's rows
  for (int e = 0; e + 1 < local; ++e) {
    next[e + 1] = next[e];
    for (int j = 0; j < ep_->size(); ++j) next[e + 1] += from[j * local + e];
  }
  Tensor size = Tensor::empty({1}, DType::kI32);
  for (int j = 0; j < ep_->size(); ++j) {
    for (int e = 0; e < local; ++e) {
      const int64_t begin = next[e], end = begin + from[j * local + e];
      size.data<int32_t>()[0] = static_cast<int32_t>(end - begin);
      Tensor down = down_->grad.slice_rows(e, e + 1);
      Tensor gate_up = gate_up_->grad.slice_rows(e, e + 1);
      grouped_matmul_tn_accumulate(dev, dout.slice_rows(begin, end),
                                   saved_.act.slice_rows(begin, end), size, down);
      grouped_matmul_tn_accumulate(dev, dgate_up.slice_rows(begin, end),
                                   saved_.xp.slice_rows(begin, end), size, gate_up);
      next[e] = end;
    }
    for (Param* p : {down_, gate_up_}) {
      exact_grad_add(dev, p->grad, p->ledger);
      p->grad.zero_();
    }
  }
}

Tensor MoeLayer::backward(Device& dev, const Tensor& dy, const Tensor& aux_prob_grad,
                          float z_loss_scale, float seq_aux_loss_scale) {
  const OpScope scope(OpKind::kExperts, OpPass::kBackward, dev);
  const int64_t total = dy.rows();
  const int64_t n = saved_.x.rows();
  const int64_t hidden = dy.row_size();
  const int64_t rows = saved_.xp.rows();
  const int64_t ffn = down_->shape[2];
  const DType dtype = dy.dtype();
  Tensor dx = Tensor::zeros({total, hidden}, dtype, MemoryKind::kActivations, dev);
  if (shared_) shared_backward(dev, dy, dx);

  const Tensor dy_mine = tp_ ? dy.slice_rows(tp_->rank() * n, (tp_->rank() + 1) * n) : dy;
  Tensor dx_mine = tp_ ? Tensor::zeros({n, hidden}, dtype, MemoryKind::kActivations, dev)
                       : dx;
  Tensor dweights = activation(dev, {n, router_.slots()});
  const Tensor dlocal_out =
      dispatcher_.combine_backward(dev, dy_mine, router_.weights(), dweights);
  const Tensor& local_counts = dispatcher_.local_counts();
  if (recompute_experts_) experts_hidden(dev);
  Tensor dact = activation(dev, {rows, ffn}, dtype);
  grouped_matmul_nn(dev, dlocal_out, down_->work, local_counts, dact);
  Tensor dgate_up = activation(dev, {rows, 2 * ffn}, dtype);
  swiglu_backward(dev, dact, saved_.gate_up_out, dgate_up);
  expert_weight_grads(dev, dlocal_out, dgate_up);
  Tensor dxp = activation(dev, {rows, hidden}, dtype);
  grouped_matmul_nn(dev, dgate_up, gate_up_->work, local_counts, dxp);
  dispatcher_.dispatch_backward(dev, dxp, dx_mine);
  router_.backward(dev, dweights, aux_prob_grad, z_loss_scale, seq_aux_loss_scale, total,
                   dx_mine);
  if (tp_) {
    Tensor dx_routed = activation(dev, {total, hidden}, dtype);
    tp_->all_gather(dx_mine, dx_routed);
    add_(dev, dx, dx_routed);
  }

  discard();
  return dx;
}

void MoeLayer::shared_backward(Device& dev, const Tensor& dy, Tensor& dx) {
  const OpScope scope(OpKind::kSharedExperts, OpPass::kBackward, dev);
  Tensor dshared = dy;
  if (shared_gate_) {
    const int64_t total = dy.rows();
    dshared = activation(dev, {total, dy.row_size()}, dy.dtype());
    Tensor dgate_logit = activation(dev, {total, 1}, dy.dtype());
    sigmoid_gate_backward(dev, dy, saved_.shared_out, saved_.shared_gate_logit, dshared,
                          dgate_logit);
    matmul(dev, dgate_logit, true, saved_.x_whole, false, shared_gate_->grad, 1.0f, 1.0f);
    matmul(dev, dgate_logit, false, shared_gate_->work, false, dx, 1.0f, 1.0f);
  }
  add_(dev, dx, shared_->backward(dev, dshared));
}

void MoeLayer::discard() {
  saved_ = {};
  router_.discard();
  dispatcher_.discard();
  if (shared_) shared_->discard();
}

void MoeLayer::discard_keeping_routing() {
  saved_ = {};
  router_.discard_keeping_routing();
  dispatcher_.discard();
  if (shared_) shared_->discard();
}

MoeLayer::Stash MoeLayer::stash() {
  return {std::exchange(saved_, {}), router_.stash(), dispatcher_.stash(),
          shared_ ? shared_->stash() : SwigluFfn::Saved{}};
}

void MoeLayer::restore(Stash&& stash) {
  saved_ = std::move(stash.own);
  router_.restore(std::move(stash.router));
  dispatcher_.restore(std::move(stash.dispatcher));
  if (shared_) shared_->restore(std::move(stash.shared));
}

}  // namespace switchyard
