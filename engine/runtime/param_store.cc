#include "engine/runtime/param_store.h"


namespace switchyard {

namespace {
uint64_t name_hash(const std::string& name) {
  // FNV-1a: stable across platforms and library versions, unlike std::hash.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

Param& ParamStore::add(std::string name, Shape shape, ShardSpec spec, ParamInit init,
                       float init_std) {
  SY_CHECK_MSG(find(name) == nullptr, "parameter registered twice");
  Param& p = params_.emplace_back();
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.spec = spec;
  p.init = init;
  p.init_std = init_std;
  // Norm gains and biases are not decayed (the usual practice for transformers).
  p.weight_decay = p.shape.size() >= 2;
  return p;
}

void ParamStore::allocate(Device& device) {
  int64_t dense = 0, expert = 0;
  for (const Param& p : params_) (p.spec.expert ? expert : dense) += shape_numel(p.shape);
  dense_grads_ = Tensor::zeros({dense}, DType::kF32, MemoryKind::kGradients, device);
  expert_grads_ = Tensor::zeros({expert}, DType::kF32, MemoryKind::kGradients, device);
  dense = expert = 0;
  for (Param& p : params_) {
    p.value = Tensor::empty(p.shape, DType::kF32, MemoryKind::kParameters, device);
    int64_t& offset = p.spec.expert ? expert : dense;
    Tensor& flat = p.spec.expert ? expert_grads_ : dense_grads_;
    const int64_t n = shape_numel(p.shape);
    p.grad = flat.slice_rows(offset, offset + n).reshape(p.shape);
    offset += n;
  }
}

void ParamStore::initialize(uint64_t seed) {
  for (Param& p : params_) {
    float* v = p.value.data<float>();
    int64_t n = p.value.numel();
    switch (p.init) {
      case ParamInit::kOnes:
        for (int64_t i = 0; i < n; ++i) v[i] = 1.0f;
        break;
      case ParamInit::kZeros:
        for (int64_t i = 0; i < n; ++i) v[i] = 0.0f;
        break;
      case ParamInit::kNormal: {
        // normal() takes two draws per value; skip those of the elements before the shard.
        Rng base = Rng(seed).fork(name_hash(p.name));
        Rng rng(base.seed(), base.counter() + 2 * static_cast<uint64_t>(p.init_offset));
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(rng.normal() * p.init_std);
        break;
      }
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

int64_t ParamStore::total_numel() const {
  int64_t n = 0;
  for (const Param& p : params_) n += shape_numel(p.shape);
  return n;
}

}  // namespace switchyard
