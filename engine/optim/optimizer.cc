#include "engine/optim/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/runtime/exact_sum.h"
#include "engine/optim/muon.h"
#include "engine/optim/zero.h"
#include "kernels/adamw.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"

namespace switchyard {

namespace {

// The decay from `from` after step `start` to min_lr at total_steps.
double decayed(const config::OptimizerConfig& opt, double from, int64_t step, int64_t start,
               int64_t total_steps) {
  const int64_t decay_steps = total_steps - start;
  if (decay_steps <= 0 || opt.decay() == config::CONSTANT) return from;
  const double min_lr = opt.min_lr();
  const double progress =
      std::min(1.0, static_cast<double>(step - start) / static_cast<double>(decay_steps));
  if (opt.decay() == config::LINEAR) return from + (min_lr - from) * progress;
  return min_lr + 0.5 * (from - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace

double learning_rate(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps,
                     const LrRestart& restart) {
  if (restart.from_step > 0 && step > restart.from_step)
    return decayed(opt, restart.from_lr, step, restart.from_step, total_steps);
  const double lr = opt.lr();
  if (opt.warmup_steps() > 0 && step <= opt.warmup_steps())
    return lr * static_cast<double>(step) / static_cast<double>(opt.warmup_steps());
  return decayed(opt, lr, step, opt.warmup_steps(), total_steps);
}

double param_learning_rate(const config::OptimizerConfig& opt, const Param& p, double lr) {
  const bool router = p.name.find(kRouterNamePart) != std::string::npos;
  if (!router || !opt.has_router_lr_scale()) return lr;
  return lr * opt.router_lr_scale();
}

AdamWOptimizer::AdamWOptimizer(const config::OptimizerConfig& opt, int64_t total_steps,
                               ParamStore& params, const Groups& groups, Device& device)
    : opt_(opt), total_steps_(total_steps), params_(params), groups_(groups) {
  auto size = [](Communicator* c) { return c ? c->size() : 1; };
  if (groups_.zero_stage >= 1)
    owner_ = assign_owners(params_, size(groups_.dense_replicas), size(groups_.expert_replicas));
  else
    owner_.assign(params_.params().size(), -1);
  size_t i = 0;
  for (const Param& p : params_.params()) {
    Communicator* replicas = p.spec.expert ? groups_.expert_replicas : groups_.dense_replicas;
    // ZeRO-2/3 row shards keep their own state.
    const bool mine = p.trainable && !(groups_.zero && !p.spec.expert) &&
                      (owner_[i] < 0 || owner_[i] == replicas->rank());
    const bool muon = p.trainable && switchyard::trained_by_muon(opt_, p);
    muon_.push_back(muon);
    const Shape shape = mine ? p.shape : Shape{0};
    const MemoryKind kind =
        p.spec.expert ? MemoryKind::kExpertOptimizerState : MemoryKind::kOptimizerState;
    // Muon keeps one momentum where AdamW keeps two moments.
    const Shape adamw_shape = muon ? Shape{0} : shape;
    exp_avg_.push_back(Tensor::zeros(adamw_shape, DType::kF32, kind, device));
    exp_avg_sq_.push_back(Tensor::zeros(adamw_shape, DType::kF32, kind, device));
    momentum_.push_back(Tensor::zeros(muon ? shape : Shape{0}, DType::kF32, kind, device));
    ++i;
  }
}

StepReport AdamWOptimizer::step(Device& dev) {
  ++step_;
  StepReport report;
  // Replicated gradients count once; the squares of shards add up over the group that
  // splits them (expert-parallel for experts, tensor-parallel for split dense tensors,
  // the data-parallel replicas for ZeRO-2/3 row shards). The sums are exact over rows, so
  // the norm has the same bits however experts and rows are split over ranks.
  ExactSum replicated_sq, tensor_parallel_sq, expert_sq;
  std::vector<Tensor> grads;
  std::vector<ExactSum*> sums;
  std::vector<std::string> names;
  for (const Param& p : params_.params()) {
    if (!p.grad.defined()) continue;  // a ZeRO-2/3 row shard, counted below
    if (!p.trainable) continue;       // frozen: neither clipped nor updated
    grads.push_back(p.grad);
    names.push_back(p.name);
    sums.push_back(p.spec.expert              ? &expert_sq
                   : p.shape != p.whole_shape ? &tensor_parallel_sq
                                              : &replicated_sq);
  }
  const std::vector<ExactSum> squares = row_sum_squares(dev, grads);
  for (size_t i = 0; i < squares.size(); ++i) sums[i]->add(squares[i]);
  if (groups_.zero) {
    const std::array<ExactSum, 2> dense = groups_.zero->gradient_squares(dev);
    replicated_sq.add(dense[0]);
    tensor_parallel_sq.add(dense[1]);
  }
  if (groups_.expert_parallel) groups_.expert_parallel->all_reduce_sum(expert_sq);
  if (groups_.tensor_parallel) groups_.tensor_parallel->all_reduce_sum(tensor_parallel_sq);
  ExactSum squares_sum = replicated_sq;
  squares_sum.add(tensor_parallel_sq);
  squares_sum.add(expert_sq);
  if (groups_.pipeline) groups_.pipeline->all_reduce_sum(squares_sum);
  report.grad_norm = std::sqrt(squares_sum.value());
  report.lr = learning_rate(opt_, step_, total_steps_, lr_restart_);
  if (!std::isfinite(report.grad_norm)) {
    for (size_t i = 0; i < squares.size() && report.non_finite_grad.empty(); ++i)
      if (!std::isfinite(squares[i].value())) report.non_finite_grad = names[i];
    report.skipped = true;
    drop_gradients();
    return report;
  }
  float grad_scale = 1.0f;
  if (opt_.grad_clip() > 0 && report.grad_norm > opt_.grad_clip()) {
    grad_scale = static_cast<float>(opt_.grad_clip() / (report.grad_norm + 1e-6));
    report.clipped = true;
  }
  // Every tensor this rank updates with AdamW goes into one multi-tensor step per learning
  // rate (one unless the router's differs), which also writes their bf16 working copies,
  // as Muon's update does; the copies of values that arrive from elsewhere (another
  // replica's ZeRO-1 update, ZeRO-2 row shards) are refreshed after they arrive.
  std::map<float, std::vector<AdamWUpdate>> updates_by_lr;
  std::vector<bool> refreshed(params_.params().size(), false);
  size_t i = 0;
  for (Param& p : params_.params()) {
    const bool sharded = groups_.zero && !p.spec.expert;  // updated by its row shards below
    Communicator* replicas = p.spec.expert ? groups_.expert_replicas : groups_.dense_replicas;
    const bool updates_here =
        p.trainable && !sharded && (owner_[i] < 0 || owner_[i] == replicas->rank());
    if (updates_here && muon_[i]) {
      muon_update(dev, i, param_learning_rate(opt_, p, report.lr), grad_scale);
      refreshed[i] = true;
    } else if (updates_here) {
      const auto lr = static_cast<float>(param_learning_rate(opt_, p, report.lr));
      updates_by_lr[lr].push_back(AdamWUpdate{&p.value, &p.grad, &exp_avg_[i], &exp_avg_sq_[i],
                                              p.weight_decay,
                                              p.has_working_copy() ? &p.work : nullptr});
      refreshed[i] = true;
    }
    ++i;
  }
  for (const auto& [lr, updates] : updates_by_lr) {
    const AdamWHyper h{lr, opt_.beta1(), opt_.beta2(), opt_.eps(), opt_.weight_decay(), step_};
    adamw_step(dev, h, grad_scale, updates);
  }
  i = 0;
  for (Param& p : params_.params()) {
    Communicator* replicas = p.spec.expert ? groups_.expert_replicas : groups_.dense_replicas;
    if (p.trainable && !(groups_.zero && !p.spec.expert) && owner_[i] >= 0)
      replicas->broadcast(p.value, owner_[i]);
    ++i;
  }
  if (groups_.zero)
    groups_.zero->update(dev, {report.lr, step_, grad_scale, groups_.tensor_parallel, owner_});
  i = 0;
  for (Param& p : params_.params()) {
    if (p.trainable && !refreshed[i] && p.has_working_copy()) convert(dev, p.value, p.work);
    ++i;
  }
  params_.zero_grads();
  return report;
}

void AdamWOptimizer::muon_update(Device& dev, size_t i, double lr, float grad_scale) {
  Param& p = params_.params()[i];
  const config::MuonConfig& muon = opt_.muon();
  Tensor update = Tensor::empty(p.shape, DType::kF32, MemoryKind::kOther, dev);
  muon_momentum(dev, muon.momentum(), muon.nesterov(), grad_scale, p.grad, momentum_[i], update);
  orthogonalize_shard(dev, muon, p, groups_.tensor_parallel, update);
  apply_muon_update(dev, opt_, p, lr, p.value, update, p.has_working_copy() ? &p.work : nullptr);
}

void AdamWOptimizer::skip_step() {
  ++step_;
  drop_gradients();
}

void AdamWOptimizer::drop_gradients() {
  params_.zero_grads();
  if (groups_.zero) groups_.zero->drop_gradients();
}

void refresh_working_copies(Device& dev, ParamStore& params) {
  for (Param& p : params.params())
    if (p.has_working_copy()) convert(dev, p.value, p.work);
}

}  // namespace switchyard
