// ParamStore: the one registry of named parameters. ZeRO, gradient reduction,
// checkpointing, resharding and Hugging Face export all work from it, so no parameter
// is special-cased by name anywhere else.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/runtime/rng.h"
#include "engine/runtime/tensor.h"

namespace switchyard {

// How a parameter is laid out across ranks.
struct ShardSpec {
  // Dimension split over the tensor-parallel group; -1 when replicated.
  int tensor_parallel_dim = -1;
  // Dimension 0 indexes experts and is split over the expert-parallel group.
  bool expert = false;
};

enum class ParamInit { kNormal, kOnes, kZeros };

struct Param {
  std::string name;  // Hugging Face naming where one exists
  Shape shape;
  ShardSpec spec;
  ParamInit init = ParamInit::kNormal;
  float init_std = 0.02f;
  bool weight_decay = true;
  // For a shard of a larger tensor (experts split over ranks): elements of the whole
  // tensor before this shard, so that initialisation draws exactly the values the
  // whole tensor would hold there.
  int64_t init_offset = 0;
  Tensor value;  // fp32 (master) weights
  Tensor grad;   // accumulated over micro-batches
};

class ParamStore {
 public:
  // Registers a parameter; memory comes with allocate().
  Param& add(std::string name, Shape shape, ShardSpec spec, ParamInit init, float init_std = 0.0f);
  // Allocates values and zeroed gradients on `device`. The gradients of all dense
  // parameters are views into one flat buffer, and those of all expert parameters into
  // another, so that each is reduced over its group in one collective.
  void allocate(Device& device);
  // Deterministic initialisation: every parameter draws from its own stream derived
  // from (seed, name), so the result does not depend on registration order.
  void initialize(uint64_t seed);
  void zero_grads();

  // Flat gradient buffers (1-D; empty when there are no such parameters).
  Tensor& dense_grads() { return dense_grads_; }
  Tensor& expert_grads() { return expert_grads_; }

  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  int64_t total_numel() const;

 private:
  // A deque keeps references returned by add() valid as more parameters register.
  std::deque<Param> params_;
  Tensor dense_grads_;
  Tensor expert_grads_;
};

}  // namespace switchyard
