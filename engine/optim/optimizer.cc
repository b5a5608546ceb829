#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/elementwise.h"

namespace switchyard {

double learning_rate(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps) {
  const double lr = opt.lr(), min_lr = opt.min_lr();
  if (opt.warmup_steps() > 0 && step <= opt.warmup_steps())
    return lr * static_cast<double>(step) / static_cast<double>(opt.warmup_steps());
  const int64_t decay_steps = total_steps - opt.warmup_steps();
  if (decay_steps <= 0 || opt.decay() == config::CONSTANT) return lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - opt.warmup_steps()) / static_cast<double>(decay_steps));
  if (opt.decay() == config::LINEAR) return lr + (min_lr - lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamWOptimizer::AdamWOptimizer(const config::OptimizerConfig& opt, int64_t total_steps,
                               ParamStore& params, const Groups& groups)
    : opt_(opt), total_steps_(total_steps), params_(params), groups_(groups) {
  // Owners balance state bytes: each parameter goes, in registration order, to the
  // replica holding the fewest elements so far (ties: the lowest rank). Every rank
  // computes the same assignment.
  auto replicas = [&](bool expert) {
    Communicator* c = expert ? groups_.expert_replicas : groups_.dense_replicas;
    return groups_.shard_state && c != nullptr && c->size() > 1 ? c : nullptr;
  };
  std::vector<int64_t> dense_load(replicas(false) ? replicas(false)->size() : 0);
  std::vector<int64_t> expert_load(replicas(true) ? replicas(true)->size() : 0);
  for (const Param& p : params_.params()) {
    Communicator* c = replicas(p.spec.expert);
    int owner = -1;
    if (c != nullptr) {
      std::vector<int64_t>& load = p.spec.expert ? expert_load : dense_load;
      owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner] += p.value.numel();
    }
    owner_.push_back(owner);
    const bool mine = owner < 0 || owner == c->rank();
    const Shape shape = mine ? p.shape : Shape{0};
    exp_avg_.push_back(Tensor::zeros(shape, DType::kF32, MemoryKind::kOptimizerState,
                                     p.value.device()));
    exp_avg_sq_.push_back(Tensor::zeros(shape, DType::kF32, MemoryKind::kOptimizerState,
                                        p.value.device()));
  }
}

StepReport AdamWOptimizer::step(Device& dev) {
  ++step_;
  StepReport report;
  // Replicated gradients count once; the squares of shards add up over the group that
  // splits them (expert-parallel for experts, tensor-parallel for split dense tensors).
  double replicated_sq = 0, tensor_parallel_sq = 0, expert_sq = 0;
  for (const Param& p : params_.params()) {
    const double sq = sum_squares(dev, p.grad);
    if (p.spec.expert) expert_sq += sq;
    else if (p.shape != p.whole_shape) tensor_parallel_sq += sq;
    else replicated_sq += sq;
  }
  if (groups_.expert_parallel) groups_.expert_parallel->all_reduce_sum(&expert_sq, 1);
  if (groups_.tensor_parallel) groups_.tensor_parallel->all_reduce_sum(&tensor_parallel_sq, 1);
  report.grad_norm = std::sqrt(replicated_sq + tensor_parallel_sq + expert_sq);
  float grad_scale = 1.0f;
  if (opt_.grad_clip() > 0 && report.grad_norm > opt_.grad_clip()) {
    grad_scale = static_cast<float>(opt_.grad_clip() / (report.grad_norm + 1e-6));
    report.clipped = true;
  }
  report.lr = learning_rate(opt_, step_, total_steps_);
  size_t i = 0;
  for (Param& p : params_.params()) {
    const int owner = owner_[i];
    Communicator* replicas = p.spec.expert ? groups_.expert_replicas : groups_.dense_replicas;
    if (owner < 0 || owner == replicas->rank()) {
      AdamWHyper h{static_cast<float>(report.lr), opt_.beta1(), opt_.beta2(), opt_.eps(),
                   p.weight_decay ? opt_.weight_decay() : 0.0f, step_};
      adamw_step(dev, h, grad_scale, p.value, p.grad, exp_avg_[i], exp_avg_sq_[i]);
    }
    if (owner >= 0) replicas->broadcast(p.value, owner);
    ++i;
  }
  params_.zero_grads();
  return report;
}

}  // namespace switchyard
