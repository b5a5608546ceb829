#include "engine/optim/exact_grads.h"

#include <algorithm>

#include "kernels/exact_grad.h"

namespace switchyard {

ExactGrads::ExactGrads(ParamStore& params, Device& dev, Communicator& dense_replicas,
                       Communicator& expert_replicas, ZeroShards* zero)
    : params_(params),
      dev_(dev),
      dense_replicas_(dense_replicas),
      expert_replicas_(expert_replicas),
      zero_(zero) {
  units_.resize(static_cast<size_t>(std::max(params.num_units(), 1)));
  int64_t dense = 0, expert = 0;
  for (const Param& p : params.params())
    if (p.trainable)
      (p.spec.expert ? expert : dense) += exact_grad_ledger_size(shape_numel(p.shape));
  dense_ledger_ = Tensor::zeros({dense}, DType::kI64, MemoryKind::kGradients, dev);
  expert_ledger_ = Tensor::zeros({expert}, DType::kI64, MemoryKind::kExpertGradients, dev);
  dense = expert = 0;
  for (Param& p : params.params()) {
    if (!p.trainable) continue;
    int64_t& offset = p.spec.expert ? expert : dense;
    const int64_t size = exact_grad_ledger_size(shape_numel(p.shape));
    p.ledger = (p.spec.expert ? expert_ledger_ : dense_ledger_).slice_rows(offset, offset + size);
    offset += size;
    units_[p.unit].push_back(&p);
  }
  if (zero_) zero_->set_reduces_gradients(false);
}

void ExactGrads::acquire(int unit) {
  if (zero_) zero_->acquire(unit);
}

void ExactGrads::release(int unit) {
  if (zero_) zero_->release(unit);
}

void ExactGrads::begin_grads(int unit) {
  if (zero_) zero_->begin_grads(unit);
}

void ExactGrads::end_grads(int unit) {
  for (Param* p : units_[unit]) {
    exact_grad_add(dev_, p->grad, p->ledger);
    p->grad.zero_();
  }
  if (zero_) zero_->end_grads(unit);
}

void ExactGrads::finish() {
  dense_replicas_.all_reduce_sum(dense_ledger_.data<int64_t>(), dense_ledger_.numel());
  expert_replicas_.all_reduce_sum(expert_ledger_.data<int64_t>(), expert_ledger_.numel());
  size_t i = 0;
  for (Param& p : params_.params()) {
    const size_t index = i++;
    if (!p.ledger.defined()) continue;
    if (!zero_ || !zero_->is_sharded(index)) {
      exact_grad_read(dev_, p.ledger, p.grad);
      continue;
    }
    ZeroShards::Shard& shard = zero_->shard(index);
    if (shard.rows == 0) continue;
    Tensor whole = Tensor::empty(p.shape, DType::kF32, MemoryKind::kGradients, dev_);
    exact_grad_read(dev_, p.ledger, whole);
    shard.grad.slice_rows(0, shard.rows)
        .copy_from(whole.slice_rows(shard.first_row, shard.first_row + shard.rows));
  }
  dense_ledger_.zero_();
  expert_ledger_.zero_();
}

}  // namespace switchyard
