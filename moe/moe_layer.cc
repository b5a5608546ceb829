#include "moe/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/exact_grad.h"
#include "kernels/gating.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "kernels/router_aux.h"
#include "kernels/swiglu.h"
#include "moe/capacity.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}

// The rows of `t` in `ranges`, one after another, in a new host tensor.
Tensor host_rows(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t rows = 0;
  for (const auto& [begin, end] : ranges) rows += end - begin;
  Tensor out = Tensor::empty({rows, t.row_size()}, t.dtype());
  int64_t row = 0;
  for (const auto& [begin, end] : ranges) {
    out.slice_rows(row, row + end - begin).copy_from(t.slice_rows(begin, end));
    row += end - begin;
  }
  return out;
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
      slots_(moe.gating() == config::EXPERT_CHOICE ? moe.num_experts() : moe.top_k()),
      gating_(moe.gating()),
      sigmoid_{.k = moe.top_k(),
               .renormalize = moe.norm_topk_prob(),
               .scaling = moe.routed_scaling_factor(),
               .num_groups = moe.num_groups(),
               .top_groups = moe.top_groups()},
      force_balance_(moe.router_force_balance()),
      sequence_aux_(moe.seq_aux_loss_coef() > 0),
      capacity_factor_(moe.capacity_factor()),
      dispatcher_(num_experts_, num_local_experts_, slots_, top_k_, ep_, tp_,
                  params.placement().expert_order) {
  const int64_t hidden = model.hidden_size();
  const int64_t ffn = moe.expert_ffn_hidden_size();
  const float std = model.init_std();
  router_ = &params.add(prefix + "gate.weight", {num_experts_, hidden}, ShardSpec{},
                        ParamInit::kNormal, std);
  if (gating_ == config::SIGMOID_TOPK) {
    // Named as DeepSeek-V3's Hugging Face layout names it.
    expert_bias_ = &params.add(prefix + "gate.e_score_correction_bias", {num_experts_},
                               ShardSpec{}, ParamInit::kZeros);
    expert_bias_->trainable = false;
    expert_bias_->weight_decay = false;
  }
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
  window_ = seq_len;
  real_tokens_.clear();
  if (std::any_of(real_tokens.begin(), real_tokens.end(), [&](int32_t t) { return t < seq_len; }))
    real_tokens_.assign(real_tokens.begin(), real_tokens.end());
  return run(dev, x, training, rng, stats, capacity_factor_, sequence_aux_ ? seq_len : 0);
}

Tensor MoeLayer::infer(Device& dev, const Tensor& x, RouterStats& stats) {
  Rng unused;
  real_tokens_.clear();
  return run(dev, x, /*training=*/false, unused, stats, /*capacity_factor=*/0, /*seq_len=*/0);
}

Tensor MoeLayer::run(Device& dev, const Tensor& x, bool training, Rng& rng, RouterStats& stats,
                     float capacity_factor, int64_t seq_len) {
  const int group = tp_ ? tp_->size() : 1;
  const int member = tp_ ? tp_->rank() : 0;
  const int64_t total = x.rows();
  SY_CHECK_MSG(total % group == 0, "MoE tokens do not split evenly over the tensor-parallel group");
  const int64_t n = total / group;
  SY_CHECK_MSG(real_tokens_.empty() || static_cast<int64_t>(real_tokens_.size()) * window_ == total,
               "MoE real tokens do not describe the batch's sequences");
  const int64_t routed = routed_tokens(total);
  const int64_t hidden = x.row_size();
  const int E = num_experts_;
  const DType dtype = x.dtype();
  x_whole_ = x;
  x_ = group > 1 ? x.slice_rows(member * n, (member + 1) * n) : x;

  // Router in fp32: the f32 master weights on f32 inputs, whatever the compute dtype.
  router_x_ = widened(x_);
  router_logits_ = activation(dev, {n, E});
  matmul(dev, router_x_, false, router_->value, true, router_logits_);
  probs_ = activation(dev, {n, E});
  expert_ids_ = activation(dev, {n, slots_}, DType::kI32);
  weights_ = activation(dev, {n, slots_});
  // This layer's routing sums (selections, probability sums, z-loss, kept assignments)
  // stay on the device until the forward's end (RouterStats::collect).
  Tensor row = stats.add_layer(routed, E, top_k_, capacity_factor).reshape({3 * E + 1, 1});
  Tensor sums = row.slice_rows(0, 2 * E + 1).reshape({2 * E + 1});
  Tensor kept = row.slice_rows(2 * E + 1, 3 * E + 1).reshape({E});
  sequence_sums_ = Tensor();
  if (seq_len > 0) {
    SY_CHECK_MSG(total % seq_len == 0, "MoE tokens are not whole sequences");
    sequence_sums_ = stats.add_sequence_sums(total / seq_len, seq_len, real_tokens_);
    sequence_rows_ = {.first_token = member * n, .seq_len = seq_len};
  }
  route(dev, member * n, capacity_factor, sums);
  if (tp_ && sequence_sums_.defined()) tp_->all_reduce_sum(sequence_sums_);

  // GShard: the second expert takes the token with probability min(1, 2 * weight); an
  // unsent assignment has expert id -1 in the dispatch plan (the gating backward keeps
  // the full top-2 selection). Token t of the group draws the t-th number of `rng`.
  Tensor dispatch_ids = expert_ids_;
  if (gating_ == config::GSHARD_TOP2 && training) {
    dispatch_ids = activation(dev, {n, top_k_}, DType::kI32);
    gshard_dispatch_ids(dev, expert_ids_, weights_, rng.seed(),
                        rng.counter() + static_cast<uint64_t>(member * n) + 1, dispatch_ids);
    rng = Rng(rng.seed(), rng.counter() + static_cast<uint64_t>(total));
  } else if (!real_tokens_.empty()) {
    dispatch_ids = activation(dev, {n, slots_}, DType::kI32);
    dispatch_ids.copy_from(expert_ids_);
  }
  // Padding goes to no expert (the router's own ids stay for its backward).
  unroute_padding(member * n, dispatch_ids);

  // Expert choice's capacity is in its choice; its dispatch drops nothing more.
  dispatcher_.plan(dev, dispatch_ids, weights_, routed,
                   gating_ == config::EXPERT_CHOICE ? 0 : capacity_factor);
  convert(dev, dispatcher_.tokens_per_expert(), kept);
  if (tp_) tp_->all_reduce_sum(row);
  xp_ = dispatcher_.dispatch(dev, x_);
  Tensor y_mine = dispatcher_.combine(dev, experts_forward(dev), weights_);
  if (recompute_experts_) gate_up_out_ = act_ = Tensor();
  Tensor y = y_mine;
  if (tp_) {
    y = activation(dev, {total, hidden}, dtype);
    tp_->all_gather(y_mine, y);
  }

  if (shared_) {
    shared_out_ = shared_->forward(dev, x);
    if (shared_gate_) {
      shared_gate_logit_ = activation(dev, {total, 1}, dtype);
      matmul(dev, x, false, shared_gate_->work, true, shared_gate_logit_);
      sigmoid_gate_forward(dev, shared_out_, shared_gate_logit_, y);
    } else {
      add_(dev, y, shared_out_);
    }
  }
  return y;
}

void MoeLayer::route(Device& dev, int64_t first_token, float capacity_factor, Tensor& sums) {
  if (gating_ == config::EXPERT_CHOICE && !real_tokens_.empty()) {
    expert_choice_among_real(dev, first_token, capacity_factor, sums);
  } else if (gating_ == config::EXPERT_CHOICE) {
    // Capacity factor 0 (dropless elsewhere, and inference) takes k tokens per expert's
    // share: n k / E.
    const int64_t capacity =
        expert_choice_capacity(capacity_factor, router_logits_.dim(0), top_k_, num_experts_);
    expert_choice_router_forward(dev, router_logits_, capacity, probs_, expert_ids_, weights_,
                                 sums);
  } else if (gating_ == config::SIGMOID_TOPK) {
    sigmoid_router_forward(dev, router_logits_, expert_bias_->value, sigmoid_, probs_,
                           expert_ids_, weights_, sums);
  } else {
    router_forward(dev, router_logits_, top_k_, gating_ != config::SOFTMAX_TOPK, probs_,
                   expert_ids_, weights_, sums);
  }
  if (!real_tokens_.empty()) {
    real_routing_sums(dev, first_token, sums);
  } else if (sequence_sums_.defined()) {
    sequence_routing_sums(dev, probs_, expert_ids_, gating_ == config::SIGMOID_TOPK,
                          sequence_rows_, sequence_sums_);
  }
  // The sums keep the router's own choice: the balance it would have had.
  if (force_balance_) round_robin_routing(dev, first_token, num_experts_, expert_ids_, weights_);
}

void MoeLayer::expert_choice_among_real(Device& dev, int64_t first_token, float capacity_factor,
                                        Tensor& sums) {
  const std::vector<std::pair<int64_t, int64_t>> real =
      row_ranges(first_token, router_logits_.rows(), /*real=*/true);
  int64_t m = 0;
  for (const auto& [begin, end] : real) m += end - begin;
  probs_.zero_();
  weights_.zero_();
  unroute_padding(first_token, expert_ids_);
  if (m == 0) return;
  // The real rows one after another, chosen among as a batch of their own.
  Tensor logits = activation(dev, {m, num_experts_});
  int64_t row = 0;
  for (const auto& [begin, end] : real) {
    logits.slice_rows(row, row + end - begin).copy_from(router_logits_.slice_rows(begin, end));
    row += end - begin;
  }
  Tensor probs = activation(dev, {m, num_experts_});
  Tensor ids = activation(dev, {m, slots_}, DType::kI32);
  Tensor weights = activation(dev, {m, slots_});
  const int64_t capacity = expert_choice_capacity(capacity_factor, m, top_k_, num_experts_);
  expert_choice_router_forward(dev, logits, capacity, probs, ids, weights, sums);
  row = 0;
  for (const auto& [begin, end] : real) {
    const int64_t rows = end - begin;
    probs_.slice_rows(begin, end).copy_from(probs.slice_rows(row, row + rows));
    expert_ids_.slice_rows(begin, end).copy_from(ids.slice_rows(row, row + rows));
    weights_.slice_rows(begin, end).copy_from(weights.slice_rows(row, row + rows));
    row += rows;
  }
}

MoeRouting MoeLayer::last_routing() const {
  if (real_tokens_.empty()) return {router_logits_, probs_, expert_ids_, weights_};
  const int64_t n = router_logits_.rows();
  const std::vector<std::pair<int64_t, int64_t>> real =
      row_ranges((tp_ ? tp_->rank() : 0) * n, n, /*real=*/true);
  return {host_rows(router_logits_, real), host_rows(probs_, real), host_rows(expert_ids_, real),
          host_rows(weights_, real)};
}

int64_t MoeLayer::routed_tokens(int64_t total) const {
  return real_tokens_.empty()
             ? total
             : std::accumulate(real_tokens_.begin(), real_tokens_.end(), int64_t{0});
}

std::vector<std::pair<int64_t, int64_t>> MoeLayer::row_ranges(int64_t first_token, int64_t n,
                                                              bool real) const {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t b = 0; b < real_tokens_.size(); ++b) {
    const int64_t start = static_cast<int64_t>(b) * window_;
    const int64_t text_end = start + real_tokens_[b];
    const int64_t begin = std::max(real ? start : text_end, first_token);
    const int64_t end = std::min(real ? text_end : start + window_, first_token + n);
    if (begin < end) ranges.emplace_back(begin - first_token, end - first_token);
  }
  return ranges;
}

void MoeLayer::unroute_padding(int64_t first_token, Tensor& ids) const {
  for (const auto& [begin, end] : row_ranges(first_token, ids.rows(), /*real=*/false)) {
    Tensor none = Tensor::empty({end - begin, ids.row_size()}, DType::kI32);
    std::fill_n(none.data<int32_t>(), none.numel(), -1);
    ids.slice_rows(begin, end).copy_from(none);
  }
}

void MoeLayer::real_routing_sums(Device& dev, int64_t first_token, Tensor& sums) {
  const int E = num_experts_;
  Tensor selections = activation(dev, {E});
  Tensor prob_sums = activation(dev, {E});
  Tensor z = activation(dev, {1});
  Tensor selections_total = sums.slice_rows(0, E);
  Tensor prob_sums_total = sums.slice_rows(E, 2 * E);
  Tensor z_total = sums.slice_rows(2 * E, 2 * E + 1);
  sums.zero_();
  Tensor sequence_part;
  if (sequence_sums_.defined()) {
    sequence_part = activation(dev, sequence_sums_.shape());
    sequence_sums_.zero_();
  }
  for (const auto& [begin, end] : row_ranges(first_token, probs_.rows(), /*real=*/true)) {
    const Tensor probs = probs_.slice_rows(begin, end);
    const Tensor ids = expert_ids_.slice_rows(begin, end);
    routing_counts(dev, probs, ids, selections, prob_sums);
    router_z_loss_sum(dev, router_logits_.slice_rows(begin, end), z);
    add_(dev, selections_total, selections);
    add_(dev, prob_sums_total, prob_sums);
    add_(dev, z_total, z);
    if (!sequence_part.defined()) continue;
    sequence_routing_sums(dev, probs, ids, gating_ == config::SIGMOID_TOPK,
                          {.first_token = first_token + begin, .seq_len = window_}, sequence_part);
    add_(dev, sequence_sums_, sequence_part);
  }
}

Tensor MoeLayer::experts_forward(Device& dev) {
  experts_hidden(dev);
  Tensor out = activation(dev, xp_.shape(), xp_.dtype());
  grouped_matmul_nt(dev, act_, down_->work, dispatcher_.local_counts(), out);
  return out;
}

void MoeLayer::experts_hidden(Device& dev) {
  const int64_t rows = xp_.rows();
  const int64_t ffn = down_->shape[2];
  gate_up_out_ = activation(dev, {rows, 2 * ffn}, xp_.dtype());
  grouped_matmul_nt(dev, xp_, gate_up_->work, dispatcher_.local_counts(), gate_up_out_);
  act_ = activation(dev, {rows, ffn}, xp_.dtype());
  swiglu_forward(dev, gate_up_out_, act_);
}

void MoeLayer::expert_weight_grads(Device& dev, const Tensor& dout, const Tensor& dgate_up) {
  const Tensor& counts = dispatcher_.local_counts();
  if (!down_->ledger.defined() || !ep_ || ep_->size() == 1) {
    grouped_matmul_tn_accumulate(dev, dout, act_, counts, down_->grad);
    grouped_matmul_tn_accumulate(dev, dgate_up, xp_, counts, gate_up_->grad);
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
      grouped_matmul_tn_accumulate(dev, dout.slice_rows(begin, end), act_.slice_rows(begin, end),
                                   size, down);
      grouped_matmul_tn_accumulate(dev, dgate_up.slice_rows(begin, end),
                                   xp_.slice_rows(begin, end), size, gate_up);
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
  const int64_t total = dy.rows();
  const int64_t n = x_.rows();
  const int64_t hidden = dy.row_size();
  const int64_t rows = xp_.rows();
  const int64_t ffn = down_->shape[2];
  const int E = num_experts_;
  const DType dtype = dy.dtype();
  Tensor dx = Tensor::zeros({total, hidden}, dtype, MemoryKind::kActivations, dev);

  if (shared_) {
    Tensor dshared;
    if (shared_gate_) {
      dshared = activation(dev, {total, hidden}, dtype);
      Tensor dgate_logit = activation(dev, {total, 1}, dtype);
      sigmoid_gate_backward(dev, dy, shared_out_, shared_gate_logit_, dshared, dgate_logit);
      matmul(dev, dgate_logit, true, x_whole_, false, shared_gate_->grad, 1.0f, 1.0f);
      matmul(dev, dgate_logit, false, shared_gate_->work, false, dx, 1.0f, 1.0f);
    } else {
      dshared = dy;
    }
    add_(dev, dx, shared_->backward(dev, dshared));
  }

  const Tensor dy_mine = tp_ ? dy.slice_rows(tp_->rank() * n, (tp_->rank() + 1) * n) : dy;
  Tensor dx_mine = tp_ ? Tensor::zeros({n, hidden}, dtype, MemoryKind::kActivations, dev)
                       : dx;
  Tensor dweights = activation(dev, {n, slots_});
  const Tensor dlocal_out = dispatcher_.combine_backward(dev, dy_mine, weights_, dweights);
  const Tensor& local_counts = dispatcher_.local_counts();
  if (recompute_experts_) experts_hidden(dev);
  Tensor dact = activation(dev, {rows, ffn}, dtype);
  grouped_matmul_nn(dev, dlocal_out, down_->work, local_counts, dact);
  Tensor dgate_up = activation(dev, {rows, 2 * ffn}, dtype);
  swiglu_backward(dev, dact, gate_up_out_, dgate_up);
  expert_weight_grads(dev, dlocal_out, dgate_up);
  Tensor dxp = activation(dev, {rows, hidden}, dtype);
  grouped_matmul_nn(dev, dgate_up, gate_up_->work, local_counts, dxp);
  dispatcher_.dispatch_backward(dev, dxp, dx_mine);

  Tensor dlogits = activation(dev, {n, E});
  if (force_balance_) {
    // The combine weights do not depend on the router.
    dlogits.zero_();
  } else if (gating_ == config::EXPERT_CHOICE) {
    expert_choice_backward(dev, probs_, expert_ids_, dweights, dlogits);
  } else if (gating_ == config::SIGMOID_TOPK) {
    sigmoid_gating_backward(dev, probs_, expert_ids_, dweights, sigmoid_, dlogits);
  } else {
    gating_backward(dev, probs_, expert_ids_, dweights, gating_ != config::SOFTMAX_TOPK, dlogits);
  }
  // The z-loss is a mean over the group's routed tokens; the kernel divides by this rank's
  // rows.
  const int64_t routed = routed_tokens(total);
  if (z_loss_scale != 0.0f && routed > 0)
    router_z_loss_backward(dev, router_logits_,
                           static_cast<float>(static_cast<double>(z_loss_scale) *
                                              static_cast<double>(n) / static_cast<double>(routed)),
                           dlogits);
  aux_loss_backward(dev, probs_, aux_prob_grad, dlogits);
  const int64_t first_token = (tp_ ? tp_->rank() : 0) * n;
  // Padding rows are routed nowhere: nothing of the losses reaches their logits.
  for (const auto& [begin, end] : row_ranges(first_token, n, /*real=*/false))
    dlogits.slice_rows(begin, end).zero_();
  if (sequence_sums_.defined() && seq_aux_loss_scale != 0.0f)
    sequence_aux_grad(dev, first_token, seq_aux_loss_scale, dlogits);
  if (tp_) {
    // The router is replicated over the group but saw only this rank's tokens.
    Tensor drouter = Tensor::zeros(router_->grad.shape(), DType::kF32, MemoryKind::kActivations, dev);
    matmul(dev, dlogits, true, router_x_, false, drouter);
    tp_->all_reduce_sum(drouter);
    add_(dev, router_->grad, drouter);
  } else {
    matmul(dev, dlogits, true, router_x_, false, router_->grad, 1.0f, 1.0f);
  }
  if (dtype == DType::kF32) {
    matmul(dev, dlogits, false, router_->value, false, dx_mine, 1.0f, 1.0f);
  } else {
    // The router's input gradient is f32; rounded once before joining the bf16 stream.
    Tensor drouted = activation(dev, {n, hidden});
    matmul(dev, dlogits, false, router_->value, false, drouted);
    Tensor rounded = activation(dev, {n, hidden}, dtype);
    convert(dev, drouted, rounded);
    add_(dev, dx_mine, rounded);
  }
  if (tp_) {
    Tensor dx_routed = activation(dev, {total, hidden}, dtype);
    tp_->all_gather(dx_mine, dx_routed);
    add_(dev, dx, dx_routed);
  }

  discard();
  return dx;
}

void MoeLayer::sequence_aux_grad(Device& dev, int64_t first_token, float seq_aux_loss_scale,
                                 Tensor& dlogits) const {
  // d(scale * loss) / d(q[t, e]) = scale * E / (k T) * selections_se / T / sequences, T
  // the tokens of t's sequence: seq_len, or with padding the sequence's real tokens.
  const int64_t sequences = sequence_sums_.dim(0);
  auto per_selection = [&](int64_t tokens) {
    const double t = static_cast<double>(tokens);
    return static_cast<float>(static_cast<double>(seq_aux_loss_scale) * num_experts_ /
                              (top_k_ * t * t * static_cast<double>(sequences)));
  };
  const bool normalize = gating_ == config::SIGMOID_TOPK;
  if (real_tokens_.empty()) {
    sequence_aux_backward(dev, probs_, sequence_sums_, normalize, sequence_rows_,
                          per_selection(sequence_rows_.seq_len), dlogits);
    return;
  }
  for (const auto& [begin, end] : row_ranges(first_token, probs_.rows(), /*real=*/true)) {
    const int64_t sequence = (first_token + begin) / window_;
    Tensor rows = dlogits.slice_rows(begin, end);
    sequence_aux_backward(dev, probs_.slice_rows(begin, end), sequence_sums_, normalize,
                          {.first_token = first_token + begin, .seq_len = window_},
                          per_selection(real_tokens_[static_cast<size_t>(sequence)]), rows);
  }
}

void MoeLayer::discard() {
  discard_keeping_routing();
  probs_ = router_logits_ = expert_ids_ = weights_ = Tensor();
  real_tokens_.clear();
}

void MoeLayer::discard_keeping_routing() {
  x_whole_ = x_ = router_x_ = Tensor();
  sequence_sums_ = Tensor();
  xp_ = gate_up_out_ = act_ = Tensor();
  dispatcher_.discard();
  shared_out_ = shared_gate_logit_ = Tensor();
  if (shared_) shared_->discard();
}

MoeLayer::Saved MoeLayer::stash() {
  Saved s;
  s.x_whole = std::exchange(x_whole_, Tensor());
  s.x = std::exchange(x_, Tensor());
  s.router_x = std::exchange(router_x_, Tensor());
  s.probs = std::exchange(probs_, Tensor());
  s.router_logits = std::exchange(router_logits_, Tensor());
  s.expert_ids = std::exchange(expert_ids_, Tensor());
  s.weights = std::exchange(weights_, Tensor());
  s.sequence_sums = std::exchange(sequence_sums_, Tensor());
  s.sequence_rows = sequence_rows_;
  s.real_tokens = std::exchange(real_tokens_, {});
  s.window = window_;
  s.xp = std::exchange(xp_, Tensor());
  s.gate_up_out = std::exchange(gate_up_out_, Tensor());
  s.act = std::exchange(act_, Tensor());
  s.shared_out = std::exchange(shared_out_, Tensor());
  s.shared_gate_logit = std::exchange(shared_gate_logit_, Tensor());
  s.dispatcher = dispatcher_.stash();
  if (shared_) s.shared = shared_->stash();
  return s;
}

void MoeLayer::restore(Saved&& s) {
  x_whole_ = std::move(s.x_whole);
  x_ = std::move(s.x);
  router_x_ = std::move(s.router_x);
  probs_ = std::move(s.probs);
  router_logits_ = std::move(s.router_logits);
  expert_ids_ = std::move(s.expert_ids);
  weights_ = std::move(s.weights);
  sequence_sums_ = std::move(s.sequence_sums);
  sequence_rows_ = s.sequence_rows;
  real_tokens_ = std::move(s.real_tokens);
  window_ = s.window;
  xp_ = std::move(s.xp);
  gate_up_out_ = std::move(s.gate_up_out);
  act_ = std::move(s.act);
  shared_out_ = std::move(s.shared_out);
  shared_gate_logit_ = std::move(s.shared_gate_logit);
  dispatcher_.restore(std::move(s.dispatcher));
  if (shared_) shared_->restore(std::move(s.shared));
}

}  // namespace switchyard
