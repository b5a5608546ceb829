// AdamW over every parameter of a ParamStore, with the learning-rate schedule and
// global gradient-norm clipping from the recipe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/config/recipe.pb.h"
#include "engine/parallel/communicator.h"
#include "engine/runtime/param_store.h"

namespace switchyard {

// Linear warmup from 0 over warmup_steps, then cosine, linear or no decay from lr to
// min_lr at total_steps. `step` is 1-based.
double learning_rate(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps);

struct StepReport {
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool clipped = false;
};

class AdamWOptimizer {
 public:
  // `expert_parallel` (may be null) is the group over which expert parameters are
  // sharded: the global gradient norm sums their squares over it.
  AdamWOptimizer(const config::OptimizerConfig& opt, int64_t total_steps, ParamStore& params,
                 Communicator* expert_parallel = nullptr);
  // Applies one update from the accumulated gradients (which are then zeroed).
  StepReport step(Device& dev);
  int64_t steps_taken() const { return step_; }

 private:
  config::OptimizerConfig opt_;
  int64_t total_steps_;
  ParamStore& params_;
  Communicator* expert_parallel_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace switchyard
