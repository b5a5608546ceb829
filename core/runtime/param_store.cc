#include "core/runtime/param_store.h"

#include <algorithm>


namespace switchyard {

namespace {
uint64_t name_hash(const std::string& name) {
  // FNV-1a: stable across platforms and library versions, unlike std::hash.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

ParamStore::ParamStore(ShardPlacement placement) : placement_(placement) {}

Param& ParamStore::add(std::string name, Shape whole_shape, ShardSpec spec, ParamInit init,
                       float init_std) {
  SY_CHECK_MSG(find(name) == nullptr, "parameter registered twice");
  Param& p = params_.emplace_back();
  p.name = std::move(name);
  p.whole_shape = std::move(whole_shape);
  p.shape = p.whole_shape;
  p.origin.assign(p.shape.size(), 0);
  auto split = [&p](size_t dim, int rank, int size) {
    SY_CHECK_MSG(dim < p.shape.size() && p.shape[dim] % size == 0,
                 "a sharded parameter dimension does not divide evenly over its group");
    p.shape[dim] /= size;
    p.origin[dim] = rank * p.shape[dim];
  };
  if (spec.expert) {
    split(0, placement_.expert_parallel_rank, placement_.expert_parallel_size);
    const std::vector<int>& order = placement_.expert_order;
    SY_CHECK_MSG(order.empty() || static_cast<int64_t>(order.size()) == p.whole_shape[0],
                 "the expert placement does not list every expert");
    if (!order.empty())
      p.whole_rows.assign(order.begin() + p.origin[0], order.begin() + p.origin[0] + p.shape[0]);
  }
  if (spec.tensor_parallel_dim >= 0 && placement_.tensor_parallel_size > 1)
    split(static_cast<size_t>(spec.tensor_parallel_dim), placement_.tensor_parallel_rank,
          placement_.tensor_parallel_size);
  p.spec = spec;
  p.unit = next_unit_ == 0 ? 0 : next_unit_ - 1;
  p.init = init;
  p.init_std = init_std;
  // Norm gains and biases are not decayed (the usual practice for transformers).
  p.weight_decay = p.shape.size() >= 2;
  return p;
}

void ParamStore::begin_unit() { ++next_unit_; }

void ParamStore::allocate(Device& device, DType compute) {
  SY_CHECK_MSG(compute == DType::kF32 || compute == DType::kBF16,
               "parameters compute in f32 or bf16");
  compute_ = compute;
  int64_t dense = 0, expert = 0;
  for (const Param& p : params_)
    if (p.grad_resident) (p.spec.expert ? expert : dense) += shape_numel(p.shape);
  dense_grads_ = Tensor::zeros({dense}, DType::kF32, MemoryKind::kGradients, device);
  expert_grads_ = Tensor::zeros({expert}, DType::kF32, MemoryKind::kExpertGradients, device);
  dense = expert = 0;
  for (Param& p : params_) {
    const MemoryKind kind =
        p.spec.expert ? MemoryKind::kExpertParameters : MemoryKind::kParameters;
    if (p.value_resident) {
      p.value = Tensor::empty(p.shape, DType::kF32, kind, device);
      p.work = compute == DType::kBF16 && p.shape.size() >= 2
                   ? Tensor::empty(p.shape, DType::kBF16, kind, device)
                   : p.value;
    }
    if (!p.grad_resident) continue;
    int64_t& offset = p.spec.expert ? expert : dense;
    Tensor& flat = p.spec.expert ? expert_grads_ : dense_grads_;
    const int64_t n = shape_numel(p.shape);
    p.grad = flat.slice_rows(offset, offset + n).reshape(p.shape);
    offset += n;
  }
}

void ParamStore::initialize(uint64_t seed) {
  for (Param& p : params_)
    if (p.value.defined()) initialize_rows(p, seed, 0, p.value);  // resident values only
}

void ParamStore::initialize_rows(const Param& p, uint64_t seed, int64_t first_row,
                                 Tensor& rows) const {
  if (rows.device().is_cuda()) {
    // Drawn on the host, so every device gets the same values.
    Tensor host = Tensor::empty(rows.shape(), rows.dtype());
    initialize_rows(p, seed, first_row, host);
    rows.copy_from(host);
    return;
  }
  float* v = rows.data<float>();
  const int64_t n = rows.numel();
  const size_t rank = p.shape.size();
  SY_CHECK_MSG(rank >= 1 && rows.dtype() == DType::kF32 &&
                   first_row + (n == 0 ? 0 : rows.dim(0)) <= p.shape[0] &&
                   n % std::max<int64_t>(1, shape_numel(p.shape) / p.shape[0]) == 0,
               "initialize_rows: rows outside the parameter");
  switch (p.init) {
    case ParamInit::kOnes:
      for (int64_t i = 0; i < n; ++i) v[i] = 1.0f;
      break;
    case ParamInit::kZeros:
      for (int64_t i = 0; i < n; ++i) v[i] = 0.0f;
      break;
    case ParamInit::kNormal: {
      // Element i of the whole tensor takes the normal() drawn at counter 2 i (two
      // draws per value); the rows walk their elements' whole-tensor indices.
      const Rng base = Rng(seed).fork(name_hash(p.name));
      std::vector<int64_t> whole_stride(rank, 1), index(rank, 0);
      for (size_t d = rank; d-- > 1;) whole_stride[d - 1] = whole_stride[d] * p.whole_shape[d];
      index[0] = first_row;
      for (int64_t i = 0; i < n; ++i) {
        int64_t whole_index = p.whole_row(index[0]) * whole_stride[0];
        for (size_t d = 1; d < rank; ++d) whole_index += (p.origin[d] + index[d]) * whole_stride[d];
        Rng rng(base.seed(), base.counter() + 2 * static_cast<uint64_t>(whole_index));
        v[i] = static_cast<float>(rng.normal() * p.init_std);
        for (size_t d = rank; d-- > 0;) {
          if (++index[d] < p.shape[d]) break;
          index[d] = 0;
        }
      }
      break;
    }
  }
}

void ParamStore::zero_grads() {
  dense_grads_.zero_();
  expert_grads_.zero_();
}

Param* ParamStore::find(const std::string& name) {
  for (Param& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ParamStore::allocation_bytes(DType compute) const {
  int64_t bytes = 0;
  for (const Param& p : params_) {
    const int64_t n = shape_numel(p.shape);
    if (p.value_resident) {
      bytes += n * 4;
      if (compute == DType::kBF16 && p.shape.size() >= 2) bytes += n * 2;
    }
    if (p.grad_resident) bytes += n * 4;
  }
  return bytes;
}

int64_t ParamStore::total_numel() const {
  int64_t n = 0;
  for (const Param& p : params_) n += shape_numel(p.shape);
  return n;
}

}  // namespace switchyard
