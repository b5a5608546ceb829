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
  for (Param& p : params_) {
    p.value = Tensor::empty(p.shape, DType::kF32, MemoryKind::kParameters, device);
    p.grad = Tensor::zeros(p.shape, DType::kF32, MemoryKind::kGradients, device);
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
        Rng rng = Rng(seed).fork(name_hash(p.name));
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(rng.normal() * p.init_std);
        break;
      }
    }
  }
}

void ParamStore::zero_grads() {
  for (Param& p : params_) p.grad.zero_();
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
