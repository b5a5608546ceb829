// ParamStore: the one registry of named parameters. ZeRO, gradient reduction,
// checkpointing, resharding and Hugging Face export all work from it, so no parameter
// is special-cased by name anywhere else.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// How a parameter is laid out across ranks.
struct ShardSpec {
  // Dimension split over the tensor-parallel group; -1 when replicated.
  int tensor_parallel_dim = -1;
  // Dimension 0 indexes experts and is split over the expert-parallel group.
  bool expert = false;
};

enum class ParamInit { kNormal, kOnes, kZeros };

// Where this process sits in the groups that split parameters: tensor-parallel rank
// and size (dimension spec.tensor_parallel_dim), expert-parallel rank and size
// (dimension 0 of expert parameters).
struct ShardPlacement {
  int tensor_parallel_rank = 0;
  int tensor_parallel_size = 1;
  int expert_parallel_rank = 0;
  int expert_parallel_size = 1;
  // parallel.expert_placement: the experts in the order the expert-parallel ranks hold
  // them, rank r the r-th E/size of the list; empty means in order.
  std::vector<int> expert_order;
};

struct Param {
  std::string name;   // Hugging Face naming where one exists
  Shape shape;        // this rank's shard
  Shape whole_shape;  // the tensor over all ranks
  // Index of the shard's first element in each dimension of the whole tensor.
  std::vector<int64_t> origin;
  // An expert shard under an expert placement: the whole tensor's row (the expert) that
  // each row of the shard holds. Empty when the shard is rows [origin[0], origin[0] +
  // shape[0]) of the whole tensor; whole_row() answers both.
  std::vector<int64_t> whole_rows;
  int64_t whole_row(int64_t row) const {
    return whole_rows.empty() ? origin[0] + row : whole_rows[static_cast<size_t>(row)];
  }
  ShardSpec spec;
  ParamInit init = ParamInit::kNormal;
  float init_std = 0.02f;
  bool weight_decay = true;
  // False for a parameter the recipe freezes (train.freeze): no optimizer state, no update.
  bool trainable = true;
  // The unit the parameter belongs to (ParamStore::begin_unit): the parameters one
  // layer uses together, gathered and reduced together under ZeRO.
  int unit = 0;
  // Whether this rank keeps the value and an accumulated gradient between steps (ZeRO
  // stages 2 and 3 keep them only on the owner; see engine/optim/zero.h).
  bool value_resident = true;
  bool grad_resident = true;
  Tensor value;  // fp32 (master) weights; undefined while not resident
  // The value the model computes with: under bf16 precision a bf16 copy of a matrix's
  // value (rounded from the master after every change: refresh_working_copies in
  // engine/optim/optimizer.h), else `value` itself.
  Tensor work;
  // Whether `work` is a copy of its own (bf16) that must follow `value`.
  bool has_working_copy() const { return work.defined() && work.raw_data() != value.raw_data(); }
  Tensor grad;  // accumulated over micro-batches; undefined while not resident
  // Under runtime.batch_invariant, the exact sum of the step's gradient parts so far
  // (engine/optim/exact_grads.h), into which `grad` is emptied; else undefined.
  Tensor ledger;
};

// Called by the model around each unit's use of its parameters, so that a sharding
// scheme can gather values before and reduce gradients after (ZeRO stages 2 and 3).
class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  // The unit's values are about to be read / are no longer needed. Uses may nest (a
  // tied embedding serves the first and the last unit); they are counted.
  virtual void acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  // Backward: the unit's gradients are about to be accumulated (calls after the first
  // in one backward pass are no-ops), and are complete for this micro-batch.
  virtual void begin_grads(int unit) = 0;
  virtual void end_grads(int unit) = 0;
};

class ParamStore {
 public:
  explicit ParamStore(ShardPlacement placement = {});

  // Registers a parameter of `whole_shape`; this rank holds the shard that `spec` and
  // the placement give (dimensions split evenly, a CHECK failure otherwise). Memory
  // comes with allocate().
  Param& add(std::string name, Shape whole_shape, ShardSpec spec, ParamInit init,
             float init_std = 0.0f);
  // Parameters registered from now on belong to the next unit (the first is unit 0).
  void begin_unit();
  int num_units() const { return next_unit_; }

  // Allocates resident values and zeroed resident gradients on `device`. The gradients
  // of all dense parameters are views into one flat buffer, and those of all expert
  // parameters into another, so that each is reduced over its group in one collective.
  // With a bf16 `compute` dtype, matrices also get a bf16 working copy (Param::work);
  // vectors (norm gains, biases) are used in f32 by every op.
  void allocate(Device& device, DType compute = DType::kF32);
  // The bytes allocate(compute) takes: resident values, their working copies and
  // resident gradients.
  int64_t allocation_bytes(DType compute) const;
  DType compute_dtype() const { return compute_; }
  // Deterministic initialisation: every parameter draws from its own stream derived
  // from (seed, name), element by element of the whole tensor, so the result depends
  // neither on registration order nor on the parallel layout.
  void initialize(uint64_t seed);
  // The same values for rows [first_row, first_row + rows.dim(0)) of dimension 0 of
  // p's shard, written into `rows` (f32, those rows' shape).
  void initialize_rows(const Param& p, uint64_t seed, int64_t first_row, Tensor& rows) const;
  void zero_grads();

  // Flat gradient buffers (1-D; empty when there are no such parameters).
  Tensor& dense_grads() { return dense_grads_; }
  Tensor& expert_grads() { return expert_grads_; }

  const ShardPlacement& placement() const { return placement_; }
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  int64_t total_numel() const;

 private:
  ShardPlacement placement_;
  DType compute_ = DType::kF32;
  int next_unit_ = 0;
  // A deque keeps references returned by add() valid as more parameters register.
  std::deque<Param> params_;
  Tensor dense_grads_;
  Tensor expert_grads_;
};

}  // namespace switchyard
