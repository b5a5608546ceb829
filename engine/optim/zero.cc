#include "engine/optim/zero.h"

#include <algorithm>

#include "core/runtime/check.h"
#include "engine/optim/muon.h"
#include "engine/optim/optimizer.h"
#include "kernels/adamw.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"

namespace switchyard {
namespace {

// `shape` with dimension 0 set to `rows`.
Shape with_rows(Shape shape, int64_t rows) {
  shape[0] = rows;
  return shape;
}

}  // namespace

std::vector<int> assign_owners(const ParamStore& params, int dense_replicas, int expert_replicas) {
  std::vector<int64_t> dense_load(dense_replicas > 1 ? dense_replicas : 0);
  std::vector<int64_t> expert_load(expert_replicas > 1 ? expert_replicas : 0);
  std::vector<int> owners;
  for (const Param& p : params.params()) {
    std::vector<int64_t>& load = p.spec.expert ? expert_load : dense_load;
    int owner = -1;
    if (!load.empty()) {
      owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner] += p.trainable ? shape_numel(p.shape) : 0;  // frozen: no state
    }
    owners.push_back(owner);
  }
  return owners;
}

ZeroShards::ZeroShards(ParamStore& params, Communicator& replicas, int stage, Device& device,
                       std::unique_ptr<Communicator> reduce_replicas, bool background,
                       const config::OptimizerConfig& optimizer)
    : params_store_(params),
      replicas_(replicas),
      stage_(stage),
      optimizer_(optimizer),
      device_(device),
      reduce_replicas_(std::move(reduce_replicas)),
      reduce_queue_(background) {
  SY_CHECK_MSG(stage == 2 || stage == 3, "ZeroShards serves ZeRO stages 2 and 3");
  units_.resize(static_cast<size_t>(std::max(params.num_units(), 1)));
  const int size = replicas_.size();
  for (Param& p : params.params()) {
    const size_t i = params_.size();
    params_.push_back(&p);
    const int64_t rows = p.shape.empty() ? 0 : p.shape[0];
    const int64_t chunk = (rows + size - 1) / size;
    chunk_rows_.push_back(chunk);
    Shard& s = shards_.emplace_back();
    if (p.spec.expert) continue;
    SY_CHECK_MSG(!p.shape.empty(), "a ZeRO-sharded parameter needs a row dimension");
    SY_CHECK_MSG(p.unit >= 0 && p.unit < static_cast<int>(units_.size()), "unit out of range");
    units_[p.unit].push_back(i);
    s.first_row = std::min(rows, replicas_.rank() * chunk);
    s.rows = std::min(rows, s.first_row + chunk) - s.first_row;
    mark_zero_residency(p, stage_);
  }
  uses_.assign(units_.size(), 0);
  grads_open_.assign(units_.size(), false);
  padded_grad_.resize(params_.size());
}

void mark_zero_residency(Param& param, int stage) {
  if (param.spec.expert) return;
  param.grad_resident = false;
  param.value_resident = stage == 2;
}

void ZeroShards::initialize(uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is_sharded(i)) continue;
    const Param& p = *params_[i];
    Shard& s = shards_[i];
    if (stage_ == 2) {
      s.value = p.value.slice_rows(s.first_row, s.first_row + s.rows);
    } else {
      s.value = Tensor::empty(with_rows(p.shape, s.rows), DType::kF32, MemoryKind::kParameters,
                              device_);
      params_store_.initialize_rows(p, seed, s.first_row, s.value);
    }
    // A frozen parameter keeps its value rows only: no gradient rows, no state. Muon
    // keeps one momentum where AdamW keeps two moments.
    const int64_t state_rows = p.trainable ? s.rows : 0;
    const bool muon = is_muon(i);
    s.grad = Tensor::zeros(with_rows(p.shape, p.trainable ? chunk_rows_[i] : 0), DType::kF32,
                           MemoryKind::kGradients, device_);
    auto state = [&](bool held) {
      return Tensor::zeros(with_rows(p.shape, held ? state_rows : 0), DType::kF32,
                           MemoryKind::kOptimizerState, device_);
    };
    s.exp_avg = state(!muon);
    s.exp_avg_sq = state(!muon);
    s.momentum = state(muon);
  }
}

bool ZeroShards::is_muon(size_t i) const {
  return is_updated(i) && trained_by_muon(optimizer_, *params_[i]);
}

Tensor ZeroShards::gather_rows(size_t i, const Tensor& mine, MemoryKind kind) {
  const Param& p = *params_[i];
  const Shard& s = shards_[i];
  const int64_t chunk = chunk_rows_[i];
  // Gathered in place: this replica's rows already sit in their slot of the whole buffer.
  Tensor all =
      Tensor::zeros(with_rows(p.shape, chunk * replicas_.size()), DType::kF32, kind, device_);
  const int64_t slot = replicas_.rank() * chunk;
  if (s.rows > 0) all.slice_rows(slot, slot + s.rows).copy_from(mine);
  replicas_.all_gather(all.slice_rows(slot, slot + chunk), all);
  return all.slice_rows(0, p.shape[0]);
}

void ZeroShards::acquire(int unit) {
  if (uses_[unit]++ > 0 || stage_ < 3) return;
  const bool bf16 = params_store_.compute_dtype() == DType::kBF16;
  for (size_t i : units_[unit]) {
    Param& p = *params_[i];
    p.value = gather_value(i);
    p.work = p.value;
    if (bf16 && p.shape.size() >= 2) {
      // The compute copy of the gathered master, as ParamStore::allocate makes it for
      // resident values.
      p.work = Tensor::empty(p.shape, DType::kBF16, MemoryKind::kParameters, device_);
      convert(device_, p.value, p.work);
    }
  }
}

void ZeroShards::release(int unit) {
  SY_CHECK_MSG(uses_[unit] > 0, "release() without acquire()");
  if (--uses_[unit] > 0 || stage_ < 3) return;
  for (size_t i : units_[unit]) params_[i]->work = params_[i]->value = Tensor();
}

void ZeroShards::begin_grads(int unit) {
  if (grads_open_[unit]) return;
  grads_open_[unit] = true;
  for (size_t i : units_[unit]) {
    Param& p = *params_[i];
    padded_grad_[i] = Tensor::zeros(with_rows(p.shape, chunk_rows_[i] * replicas_.size()),
                                    DType::kF32, MemoryKind::kGradients, device_);
    p.grad = padded_grad_[i].slice_rows(0, p.shape[0]);
  }
}

void ZeroShards::end_grads(int unit) {
  SY_CHECK_MSG(grads_open_[unit], "end_grads() without begin_grads()");
  grads_open_[unit] = false;
  // The previous unit's reductions finish first: whole-size gradient buffers are what
  // ZeRO-2/3 saves, so at most two units' worth exist at a time (one being reduced,
  // one being computed).
  finish_reductions();
  for (size_t i : units_[unit]) {
    if (!is_updated(i) || !reduces_) {  // frozen, or taken by ExactGrads: goes unreduced
      params_[i]->grad = padded_grad_[i] = Tensor();
      continue;
    }
    Reduction& r = in_flight_.emplace_back();
    r.whole = std::move(padded_grad_[i]);
    r.grad = shards_[i].grad;
    r.mine = Tensor::empty(r.grad.shape(), DType::kF32, MemoryKind::kGradients, device_);
    reduce_queue_.post([this, whole = r.whole, mine = r.mine]() mutable {
      reduce_replicas_->reduce_scatter_sum(whole, mine);
    });
    params_[i]->grad = padded_grad_[i] = Tensor();
  }
}

void ZeroShards::finish_reductions() {
  reduce_queue_.wait();
  if (in_flight_.empty()) return;
  reduce_replicas_->join_compute();
  for (Reduction& r : in_flight_) add_(device_, r.grad, r.mine);
  in_flight_.clear();
}

std::array<ExactSum, 2> ZeroShards::gradient_squares(Device& dev) {
  std::array<ExactSum, 2> squares;
  std::vector<Tensor> grads;
  std::vector<int> kinds;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is_updated(i)) continue;
    grads.push_back(shards_[i].grad);
    kinds.push_back(params_[i]->shape != params_[i]->whole_shape ? 1 : 0);
  }
  const std::vector<ExactSum> sums = row_sum_squares(dev, grads);
  for (size_t k = 0; k < sums.size(); ++k) squares[kinds[k]].add(sums[k]);
  for (ExactSum& sum : squares) replicas_.all_reduce_sum(sum);
  return squares;
}

void ZeroShards::update(Device& dev, const Step& step) {
  const config::OptimizerConfig& opt = optimizer_;
  muon_update(dev, step);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is_updated(i)) continue;
    Param& p = *params_[i];
    Shard& s = shards_[i];
    if (s.rows > 0 && !is_muon(i)) {
      const AdamWHyper h{static_cast<float>(param_learning_rate(opt, p, step.lr)), opt.beta1(),
                         opt.beta2(), opt.eps(),
                         p.weight_decay ? opt.weight_decay() : 0.0f, step.step};
      const Tensor grad = s.grad.slice_rows(0, s.rows);
      adamw_step(dev, h, step.grad_scale, s.value, grad, s.exp_avg, s.exp_avg_sq);
    }
    s.grad.zero_();
    if (stage_ == 2) p.value.copy_from(gather_value(i));
  }
}

void ZeroShards::muon_update(Device& dev, const Step& step) {
  const config::MuonConfig& muon = optimizer_.muon();
  auto owns = [&](size_t i) {
    return step.owners[i] < 0 || step.owners[i] == replicas_.rank();
  };
  // First every matrix's momentum output is gathered whole and its owner orthogonalises
  // it (the owners work at once), then each owner's result reaches the other replicas.
  std::vector<Tensor> updates(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is_muon(i)) continue;
    Shard& s = shards_[i];
    Tensor rows = Tensor::empty(with_rows(params_[i]->shape, s.rows), DType::kF32,
                                MemoryKind::kOptimizerState, dev);
    muon_momentum(dev, muon.momentum(), muon.nesterov(), step.grad_scale,
                  s.grad.slice_rows(0, s.rows), s.momentum, rows);
    Tensor whole = gather_rows(i, rows, MemoryKind::kOptimizerState);
    if (!owns(i)) continue;
    orthogonalize_shard(dev, muon, *params_[i], step.tensor_parallel, whole);
    updates[i] = whole;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is_muon(i)) continue;
    Param& p = *params_[i];
    Shard& s = shards_[i];
    if (step.owners[i] >= 0) {
      if (!owns(i))
        updates[i] = Tensor::empty(p.shape, DType::kF32, MemoryKind::kOptimizerState, dev);
      replicas_.broadcast(updates[i], step.owners[i]);
    }
    const double lr = param_learning_rate(optimizer_, p, step.lr);
    const Tensor update = updates[i].slice_rows(s.first_row, s.first_row + s.rows);
    apply_muon_update(dev, optimizer_, p, lr, s.value, update, nullptr);
    updates[i] = Tensor();
  }
}

void ZeroShards::drop_gradients() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (is_updated(i)) shards_[i].grad.zero_();
}

Tensor ZeroShards::whole_value(Param& p) {
  if (p.spec.expert || stage_ < 3) return p.value;
  const auto it = std::find(params_.begin(), params_.end(), &p);
  SY_CHECK_MSG(it != params_.end(), "whole_value() of a parameter of another store");
  Tensor whole = Tensor::empty(p.shape, DType::kF32, MemoryKind::kOther, device_);
  whole.copy_from(gather_value(static_cast<size_t>(it - params_.begin())));
  return whole;
}

}  // namespace switchyard
