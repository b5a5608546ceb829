#include "moe/router.h"

#include <algorithm>
#include <numeric>

#include "core/config/recipe.h"
#include "core/runtime/check.h"
#include "core/runtime/op_clock.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/gating.h"
#include "kernels/gemm.h"
#include "kernels/router_aux.h"
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

PaddedWindows PaddedWindows::of(std::span<const int32_t> real_tokens, int64_t seq_len) {
  if (std::none_of(real_tokens.begin(), real_tokens.end(),
                   [&](int32_t t) { return t < seq_len; }))
    return {};
  return {.real_tokens = {real_tokens.begin(), real_tokens.end()}, .window = seq_len};
}

int64_t PaddedWindows::tokens(int64_t total) const {
  return empty() ? total : std::accumulate(real_tokens.begin(), real_tokens.end(), int64_t{0});
}

std::vector<std::pair<int64_t, int64_t>> PaddedWindows::ranges(int64_t first_token, int64_t n,
                                                               bool real) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t b = 0; b < real_tokens.size(); ++b) {
    const int64_t start = static_cast<int64_t>(b) * window;
    const int64_t text_end = start + real_tokens[b];
    const int64_t begin = std::max(real ? start : text_end, first_token);
    const int64_t end = std::min(real ? text_end : start + window, first_token + n);
    if (begin < end) out.emplace_back(begin - first_token, end - first_token);
  }
  return out;
}

void PaddedWindows::unroute(int64_t first_token, Tensor& ids) const {
  for (const auto& [begin, end] : ranges(first_token, ids.rows(), /*real=*/false)) {
    Tensor none = Tensor::empty({end - begin, ids.row_size()}, DType::kI32);
    std::fill_n(none.data<int32_t>(), none.numel(), -1);
    ids.slice_rows(begin, end).copy_from(none);
  }
}

// A gating's two passes, side by side: the only place where the gatings differ.
struct Router::Gate {
  // The logits (n, E) of `t` -> its scores, choice and weights, and the routing sums
  // (2E + 1): the choices per expert, the score sums and the z-loss sum.
  void (*forward)(Device& dev, const Router& r, float capacity_factor, MoeRouting& t,
                  Tensor& sums);
  // dweights (n, slots) -> dlogits (n, E) written, through the weights and the scores,
  // the choice held fixed.
  void (*backward)(Device& dev, const Router& r, const MoeRouting& t, const Tensor& dweights,
                   Tensor& dlogits);
  // The sequence-wise aux loss divides each token's scores by their sum (sigmoid scores
  // do not add up to 1).
  bool normalized_sequence_scores;
};

const Router::Gate& Router::gate_for(const config::MoeConfig& moe) {
  static constexpr Gate kSoftmaxTopK{
      .forward = [](Device& dev, const Router& r, float, MoeRouting& t, Tensor& sums) {
        router_forward(dev, t.logits, r.top_k_, r.gating_.renormalize, t.probs, t.expert_ids,
                       t.weights, sums);
      },
      .backward = [](Device& dev, const Router& r, const MoeRouting& t, const Tensor& dweights,
                     Tensor& dlogits) {
        gating_backward(dev, t.probs, t.expert_ids, dweights, r.gating_.renormalize, dlogits);
      },
      .normalized_sequence_scores = false};
  static constexpr Gate kSigmoidTopK{
      .forward = [](Device& dev, const Router& r, float, MoeRouting& t, Tensor& sums) {
        sigmoid_router_forward(dev, t.logits, r.bias_->value, r.gating_, t.probs, t.expert_ids,
                               t.weights, sums);
      },
      .backward = [](Device& dev, const Router& r, const MoeRouting& t, const Tensor& dweights,
                     Tensor& dlogits) {
        sigmoid_gating_backward(dev, t.probs, t.expert_ids, dweights, r.gating_, dlogits);
      },
      .normalized_sequence_scores = true};
  static constexpr Gate kExpertChoice{
      // Capacity factor 0 (dropless elsewhere, and inference) takes k tokens per expert's
      // share: n k / E.
      .forward = [](Device& dev, const Router& r, float capacity_factor, MoeRouting& t,
                    Tensor& sums) {
        const int64_t capacity =
            expert_choice_capacity(capacity_factor, t.logits.rows(), r.top_k_, r.num_experts_);
        expert_choice_router_forward(dev, t.logits, capacity, t.probs, t.expert_ids, t.weights,
                                     sums);
      },
      .backward = [](Device& dev, const Router&, const MoeRouting& t, const Tensor& dweights,
                     Tensor& dlogits) {
        expert_choice_backward(dev, t.probs, t.expert_ids, dweights, dlogits);
      },
      .normalized_sequence_scores = false};
  if (moe.gating() == config::EXPERT_CHOICE) return kExpertChoice;
  return moe.score_function() == config::SIGMOID ? kSigmoidTopK : kSoftmaxTopK;
}

Router::Router(ParamStore& params, const std::string& prefix, const config::MoeConfig& moe,
               int64_t hidden, float init_std, Communicator* tensor_parallel)
    : num_experts_(moe.num_experts()),
      top_k_(moe.top_k()),
      slots_(moe.gating() == config::EXPERT_CHOICE ? moe.num_experts() : moe.top_k()),
      gate_(gate_for(moe)),
      gating_{.k = moe.top_k(),
              .renormalize = config::effective_renormalize(moe),
              .scaling = moe.routed_scaling_factor(),
              .num_groups = moe.num_groups(),
              .top_groups = moe.top_groups()},
      expert_choice_(moe.gating() == config::EXPERT_CHOICE),
      gshard_(moe.gating() == config::GSHARD_TOP2),
      force_balance_(moe.router_force_balance()),
      tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr) {
  weight_ = &params.add(prefix + "gate.weight", {num_experts_, hidden}, ShardSpec{},
                        ParamInit::kNormal, init_std);
  if (moe.score_function() == config::SIGMOID) {
    // Named as DeepSeek-V3's Hugging Face layout names it.
    bias_ = &params.add(prefix + "gate.e_score_correction_bias", {num_experts_}, ShardSpec{},
                        ParamInit::kZeros);
    bias_->trainable = false;
    bias_->weight_decay = false;
  }
}

void Router::forward(Device& dev, const Tensor& x, int64_t first_token, PaddedWindows padding,
                     float capacity_factor, int64_t seq_len, RouterStats& stats, Tensor& sums) {
  const OpScope scope(OpKind::kRouter, OpPass::kForward, dev);
  const int64_t n = x.rows();
  const int E = num_experts_;
  // In fp32: the f32 master weights on f32 inputs, whatever the compute dtype.
  saved_ = {.padding = std::move(padding), .x = widened(x), .first_token = first_token};
  MoeRouting& t = saved_.routing;
  t.logits = activation(dev, {n, E});
  matmul(dev, saved_.x, false, weight_->value, true, t.logits);
  t.probs = activation(dev, {n, E});
  t.expert_ids = activation(dev, {n, slots_}, DType::kI32);
  t.weights = activation(dev, {n, slots_});
  if (seq_len > 0) {
    const int64_t total = n * (tp_ ? tp_->size() : 1);
    SY_CHECK_MSG(total % seq_len == 0, "MoE tokens are not whole sequences");
    saved_.sequence_sums =
        stats.add_sequence_sums(total / seq_len, seq_len, saved_.padding.real_tokens);
    saved_.sequence_rows = {.first_token = first_token, .seq_len = seq_len};
  }
  // Top-k gating is row by row: it gates the padding too, and the sums are then taken
  // again over the real rows.
  if (expert_choice_ && !saved_.padding.empty()) {
    gate_real_rows(dev, capacity_factor, sums);
  } else {
    gate_.forward(dev, *this, capacity_factor, t, sums);
  }
  if (!saved_.padding.empty()) {
    real_routing_sums(dev, sums);
  } else if (saved_.sequence_sums.defined()) {
    sequence_routing_sums(dev, t.probs, t.expert_ids, gate_.normalized_sequence_scores,
                          saved_.sequence_rows, saved_.sequence_sums);
  }
  // The sums keep the router's own choice: the balance it would have had.
  if (force_balance_) round_robin_routing(dev, first_token, E, t.expert_ids, t.weights);
  if (tp_ && saved_.sequence_sums.defined()) tp_->all_reduce_sum(saved_.sequence_sums);
}

void Router::gate_real_rows(Device& dev, float capacity_factor, Tensor& sums) {
  MoeRouting& t = saved_.routing;
  const std::vector<std::pair<int64_t, int64_t>> real =
      saved_.padding.ranges(saved_.first_token, t.logits.rows(), /*real=*/true);
  int64_t m = 0;
  for (const auto& [begin, end] : real) m += end - begin;
  t.probs.zero_();
  t.weights.zero_();
  saved_.padding.unroute(saved_.first_token, t.expert_ids);
  if (m == 0) return;
  // The real rows one after another, gated as a batch of their own.
  MoeRouting rows{.logits = activation(dev, {m, num_experts_}),
                  .probs = activation(dev, {m, num_experts_}),
                  .expert_ids = activation(dev, {m, slots_}, DType::kI32),
                  .weights = activation(dev, {m, slots_})};
  int64_t row = 0;
  for (const auto& [begin, end] : real) {
    rows.logits.slice_rows(row, row + end - begin).copy_from(t.logits.slice_rows(begin, end));
    row += end - begin;
  }
  gate_.forward(dev, *this, capacity_factor, rows, sums);
  row = 0;
  for (const auto& [begin, end] : real) {
    const int64_t size = end - begin;
    t.probs.slice_rows(begin, end).copy_from(rows.probs.slice_rows(row, row + size));
    t.expert_ids.slice_rows(begin, end).copy_from(rows.expert_ids.slice_rows(row, row + size));
    t.weights.slice_rows(begin, end).copy_from(rows.weights.slice_rows(row, row + size));
    row += size;
  }
}

void Router::real_routing_sums(Device& dev, Tensor& sums) {
  const int E = num_experts_;
  const MoeRouting& t = saved_.routing;
  Tensor selections = activation(dev, {E});
  Tensor prob_sums = activation(dev, {E});
  Tensor z = activation(dev, {1});
  Tensor selections_total = sums.slice_rows(0, E);
  Tensor prob_sums_total = sums.slice_rows(E, 2 * E);
  Tensor z_total = sums.slice_rows(2 * E, 2 * E + 1);
  sums.zero_();
  Tensor sequence_part;
  if (saved_.sequence_sums.defined()) {
    sequence_part = activation(dev, saved_.sequence_sums.shape());
    saved_.sequence_sums.zero_();
  }
  const int64_t first_token = saved_.first_token;
  for (const auto& [begin, end] : saved_.padding.ranges(first_token, t.probs.rows(), true)) {
    const Tensor probs = t.probs.slice_rows(begin, end);
    const Tensor ids = t.expert_ids.slice_rows(begin, end);
    routing_counts(dev, probs, ids, selections, prob_sums);
    router_z_loss_sum(dev, t.logits.slice_rows(begin, end), z);
    add_(dev, selections_total, selections);
    add_(dev, prob_sums_total, prob_sums);
    add_(dev, z_total, z);
    if (!sequence_part.defined()) continue;
    sequence_routing_sums(
        dev, probs, ids, gate_.normalized_sequence_scores,
        {.first_token = first_token + begin, .seq_len = saved_.padding.window}, sequence_part);
    add_(dev, saved_.sequence_sums, sequence_part);
  }
}

Tensor Router::dispatch_ids(Device& dev, bool training, Rng& rng, int64_t total) const {
  const MoeRouting& t = saved_.routing;
  const int64_t n = t.expert_ids.rows();
  Tensor ids = t.expert_ids;
  // GShard: the second expert takes the token with probability min(1, 2 * weight); an
  // unsent assignment has expert id -1 in the dispatch plan (the gating backward keeps
  // the full top-2 selection).
  if (gshard_ && training) {
    ids = activation(dev, {n, top_k_}, DType::kI32);
    gshard_dispatch_ids(dev, t.expert_ids, t.weights, rng.seed(),
                        rng.counter() + static_cast<uint64_t>(saved_.first_token) + 1, ids);
    rng = Rng(rng.seed(), rng.counter() + static_cast<uint64_t>(total));
  } else if (!saved_.padding.empty()) {
    ids = activation(dev, {n, slots_}, DType::kI32);
    ids.copy_from(t.expert_ids);
  }
  // Padding goes to no expert (the router's own ids stay for its backward).
  saved_.padding.unroute(saved_.first_token, ids);
  return ids;
}

void Router::backward(Device& dev, const Tensor& dweights, const Tensor& aux_prob_grad,
                      float z_loss_scale, float seq_aux_loss_scale, int64_t total, Tensor& dx) {
  const OpScope scope(OpKind::kRouter, OpPass::kBackward, dev);
  const MoeRouting& t = saved_.routing;
  const int64_t n = t.logits.rows();
  Tensor dlogits = activation(dev, {n, num_experts_});
  if (force_balance_) {
    // The combine weights do not depend on the router.
    dlogits.zero_();
  } else {
    gate_.backward(dev, *this, t, dweights, dlogits);
  }
  // The z-loss is a mean over the group's routed tokens; the kernel divides by this rank's
  // rows.
  const int64_t routed = saved_.padding.tokens(total);
  if (z_loss_scale != 0.0f && routed > 0)
    router_z_loss_backward(dev, t.logits,
                           static_cast<float>(static_cast<double>(z_loss_scale) *
                                              static_cast<double>(n) / static_cast<double>(routed)),
                           dlogits);
  aux_loss_backward(dev, t.probs, aux_prob_grad, dlogits);
  // Padding rows are routed nowhere: nothing of the losses reaches their logits.
  for (const auto& [begin, end] : saved_.padding.ranges(saved_.first_token, n, false))
    dlogits.slice_rows(begin, end).zero_();
  if (saved_.sequence_sums.defined() && seq_aux_loss_scale != 0.0f)
    sequence_aux_grad(dev, seq_aux_loss_scale, dlogits);
  weight_and_input_grads(dev, dlogits, dx);
}

void Router::sequence_aux_grad(Device& dev, float seq_aux_loss_scale, Tensor& dlogits) const {
  // d(scale * loss) / d(q[t, e]) = scale * E / (k T) * selections_se / T / sequences, T
  // the tokens of t's sequence: seq_len, or with padding the sequence's real tokens.
  const int64_t sequences = saved_.sequence_sums.dim(0);
  auto per_selection = [&](int64_t tokens) {
    const double t = static_cast<double>(tokens);
    return static_cast<float>(static_cast<double>(seq_aux_loss_scale) * num_experts_ /
                              (top_k_ * t * t * static_cast<double>(sequences)));
  };
  const Tensor& probs = saved_.routing.probs;
  const bool normalize = gate_.normalized_sequence_scores;
  const PaddedWindows& padding = saved_.padding;
  if (padding.empty()) {
    sequence_aux_backward(dev, probs, saved_.sequence_sums, normalize, saved_.sequence_rows,
                          per_selection(saved_.sequence_rows.seq_len), dlogits);
    return;
  }
  const int64_t first_token = saved_.first_token;
  for (const auto& [begin, end] : padding.ranges(first_token, probs.rows(), /*real=*/true)) {
    const int64_t sequence = (first_token + begin) / padding.window;
    Tensor rows = dlogits.slice_rows(begin, end);
    sequence_aux_backward(dev, probs.slice_rows(begin, end), saved_.sequence_sums, normalize,
                          {.first_token = first_token + begin, .seq_len = padding.window},
                          per_selection(padding.real_tokens[static_cast<size_t>(sequence)]),
                          rows);
  }
}

void Router::weight_and_input_grads(Device& dev, const Tensor& dlogits, Tensor& dx) {
  const int64_t n = dlogits.rows();
  const int64_t hidden = dx.row_size();
  if (tp_) {
    // The router is replicated over the group but saw only this rank's tokens.
    Tensor dweight =
        Tensor::zeros(weight_->grad.shape(), DType::kF32, MemoryKind::kActivations, dev);
    matmul(dev, dlogits, true, saved_.x, false, dweight);
    tp_->all_reduce_sum(dweight);
    add_(dev, weight_->grad, dweight);
  } else {
    matmul(dev, dlogits, true, saved_.x, false, weight_->grad, 1.0f, 1.0f);
  }
  if (dx.dtype() == DType::kF32) {
    matmul(dev, dlogits, false, weight_->value, false, dx, 1.0f, 1.0f);
    return;
  }
  // The router's input gradient is f32; rounded once before joining the bf16 stream.
  Tensor drouted = activation(dev, {n, hidden});
  matmul(dev, dlogits, false, weight_->value, false, drouted);
  Tensor rounded = activation(dev, {n, hidden}, dx.dtype());
  convert(dev, drouted, rounded);
  add_(dev, dx, rounded);
}

MoeRouting Router::last_routing() const {
  const MoeRouting& t = saved_.routing;
  if (saved_.padding.empty()) return t;
  const std::vector<std::pair<int64_t, int64_t>> real =
      saved_.padding.ranges(saved_.first_token, t.logits.rows(), /*real=*/true);
  return {host_rows(t.logits, real), host_rows(t.probs, real), host_rows(t.expert_ids, real),
          host_rows(t.weights, real)};
}

}  // namespace switchyard
