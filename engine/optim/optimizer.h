// AdamW over every parameter of a ParamStore, or under optimizer.algorithm MUON, Muon over
// its hidden weight matrices and AdamW over the rest (engine/optim/muon.h), with the
// learning-rate schedule and global gradient-norm clipping from the recipe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "engine/optim/zero.h"

namespace switchyard {

// A decay restarted after step from_step (a schedule changed on resume): from from_lr,
// the rate the run had at from_step, to min_lr at total_steps. from_step 0: none.
struct LrRestart {
  int64_t from_step = 0;
  double from_lr = 0;
};

// Linear warmup from 0 over warmup_steps, then cosine, linear or no decay from lr to
// min_lr at total_steps; after a restart's from_step, the same decay from its from_lr
// to min_lr at total_steps instead (a resume only asks for steps after it). `step` is
// 1-based.
double learning_rate(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps,
                     const LrRestart& restart = {});

// The router's parameters are those whose name holds this part: what
// optimizer.router_lr_scale scales and what train.freeze's "router" group names.
inline constexpr char kRouterNamePart[] = ".mlp.gate.weight";

// The learning rate of parameter `p` when the schedule gives `lr`: lr times
// optimizer.router_lr_scale (unset: 1) for the router, lr for the rest.
double param_learning_rate(const config::OptimizerConfig& opt, const Param& p, double lr);

struct StepReport {
  // The scheduled learning rate (the router's is param_learning_rate's).
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool clipped = false;
  // A gradient norm that is not finite (the same on every rank) updates nothing.
  bool skipped = false;
  // Then the first parameter (registration order) whose gradient on this rank is not
  // finite; empty where this rank holds none (another rank's shard, a ZeRO-2/3 row shard).
  std::string non_finite_grad;
};

// Rounds each parameter's master value into its bf16 working copy (Param::work) where
// it has one: after initialisation, after loading a checkpoint, and after every update
// (AdamWOptimizer::step does that one).
void refresh_working_copies(Device& dev, ParamStore& params);


class AdamWOptimizer {
 public:
  // Groups (each may be null: one process):
  //  - tensor_parallel: dense parameters split over it (the ParamStore's placement)
  //    add their squares over it to the global gradient norm.
  //  - expert_parallel: expert parameters are sharded over it; the global gradient
  //    norm sums their squares over it.
  //  - dense_replicas / expert_replicas: the ranks holding identical copies of the dense
  //    (data-parallel group) and expert (expert-data-parallel group) parameters. From
  //    ZeRO stage 1 on, each parameter's state lives on one replica, its owner
  //    (assign_owners, engine/optim/zero.h), which updates it and broadcasts the new
  //    values to the others.
  //  - zero: at ZeRO stages 2 and 3, the row shards that hold the dense parameters'
  //    gradients and state (null otherwise); dense parameters are updated there, a Muon
  //    matrix orthogonalised whole by its owner.
  struct Groups {
    Communicator* tensor_parallel = nullptr;
    Communicator* expert_parallel = nullptr;
    Communicator* dense_replicas = nullptr;
    Communicator* expert_replicas = nullptr;
    int zero_stage = 0;
    ZeroShards* zero = nullptr;
    // With pipeline stages: each stage's squares add up over the pipeline group.
    Communicator* pipeline = nullptr;
  };
  // The state lives on `device`.
  AdamWOptimizer(const config::OptimizerConfig& opt, int64_t total_steps, ParamStore& params,
                 const Groups& groups, Device& device);
  // Applies one update from the accumulated gradients (which are then zeroed), unless
  // their norm is not finite (report.skipped).
  StepReport step(Device& dev);
  // Counts a step without an update (its loss was not finite) and drops its gradients,
  // so the schedule and bias corrections stay those of the step count, as on resume.
  void skip_step();
  int64_t steps_taken() const { return step_; }
  // Resuming: the bias corrections and schedule continue from `steps`.
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // Resuming a run whose schedule was changed: the decay restarts as `restart` says.
  void set_lr_restart(const LrRestart& restart) { lr_restart_ = restart; }

  // State of the i-th parameter (registration order): its owner among the replicas
  // (-1: every replica holds it) and, where this rank holds it, AdamW's moments or, for a
  // matrix Muon trains, Muon's momentum (the other tensors empty).
  int owner(size_t i) const { return owner_[i]; }
  bool holds_state(size_t i) const {
    return exp_avg_[i].shape() != Shape{0} || momentum_[i].shape() != Shape{0};
  }
  bool trained_by_muon(size_t i) const { return muon_[i]; }
  Tensor& exp_avg(size_t i) { return exp_avg_[i]; }
  Tensor& exp_avg_sq(size_t i) { return exp_avg_sq_[i]; }
  Tensor& momentum(size_t i) { return momentum_[i]; }

 private:
  // Zeroes the accumulated gradients (the ParamStore's and ZeRO's row shards).
  void drop_gradients();
  // Muon's update of parameter i, which this rank holds whole (its tensor-parallel shard).
  void muon_update(Device& dev, size_t i, double lr, float grad_scale);

  config::OptimizerConfig opt_;
  int64_t total_steps_;
  ParamStore& params_;
  Groups groups_;
  // Per parameter: the replica that owns its state (-1: every replica updates it), and
  // that state (empty on the other replicas).
  std::vector<int> owner_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_, momentum_;
  std::vector<bool> muon_;  // trained by Muon
  int64_t step_ = 0;
  LrRestart lr_restart_;
};

}  // namespace switchyard
