// The parallel layout of a job and the process groups that realise it.
//
// world = pp x dp x tp, ranks numbered with tp fastest and pp slowest:
// rank = pp_index * (dp * tp) + dp_index * tp + tp_index. Each pipeline stage is the
// block of dp * tp consecutive ranks of one pp_index, and every group but the pipeline
// group lies inside one stage (the stage's "position" of a rank is rank % (dp * tp)):
//   tp group:        the tp consecutive ranks of one dp_index (dense layers split weights)
//   dp group:        the ranks of the stage with the same tp_index (replicas of one shard)
//   ep group:        ep consecutive ranks (position / ep equal); experts are split over it
//   expert_dp group: the ranks of the stage with the same position in their ep group
//                    (position % ep equal); replicas of the same experts
//   pipeline group:  the ranks with the same position in every stage, in stage order
//                    (activations and gradients travel along it, docs/pipeline.md)
// MoE layers fold the tp ranks' tokens apart before routing (DESIGN.md, Topology), so
// the ep group need not align with tp groups; ep only has to divide the stage.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard {

struct Layout {
  int world_size = 1;
  int pipeline_parallel_size = 1;
  int virtual_pipeline_size = 1;
  config::PipelineSchedule pipeline_schedule = config::ONE_F_ONE_B;
  int tensor_parallel_size = 1;
  int data_parallel_size = 1;
  int expert_parallel_size = 1;
  int expert_data_parallel_size = 1;
  // Experts held by each rank of an ep group (moe.num_experts / ep; 0 without MoE).
  int num_local_experts = 0;
  // Sequences per optimizer step (fixed by the recipe, whatever the layout), per
  // forward/backward pass on one dp rank, and passes per step on each dp rank.
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;
  int64_t micro_batches_per_step = 0;

  // A rank's index inside each of its groups; it is also that rank's rank in the
  // group's communicator.
  int stage_size() const { return world_size / pipeline_parallel_size; }
  int tp_index(int rank) const { return rank % tensor_parallel_size; }
  int dp_index(int rank) const { return rank % stage_size() / tensor_parallel_size; }
  int ep_index(int rank) const { return rank % expert_parallel_size; }
  int expert_dp_index(int rank) const { return rank % stage_size() / expert_parallel_size; }
  int pp_index(int rank) const { return rank / stage_size(); }
  // The world ranks of each group `rank` belongs to, in group order.
  std::vector<int> tp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  std::vector<int> ep_group(int rank) const;
  std::vector<int> expert_dp_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  // The pipeline's shape for one step (pipeline_schedule.h).
  PipelineShape pipeline_shape() const;
};

// Checks the recipe's parallel settings against `world_size` before any work starts and
// derives the layout. Errors are InvalidArgument, one line naming the field, e.g.
// "parallel.tensor_parallel_size (3) must divide the world size (4)". Zero fields take
// their recipe defaults (tp, ep 1; micro_batch_size = global_batch_size).
absl::StatusOr<Layout> make_layout(const config::Recipe& recipe, int world_size);

// One communicator per group of this process's rank.
struct ProcessGroups {
  // The host communicators that device ones were made over (use_nccl), kept for them;
  // first, so that they outlive them.
  std::vector<std::unique_ptr<Communicator>> hosts;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> expert_dp;
  std::unique_ptr<Communicator> pipeline;
  // The dp group again, as a communicator of its own for gradient reductions that run
  // on a background thread while the main thread computes; and whether MPI lets them
  // (MpiRuntime::threads_communicate).
  std::unique_ptr<Communicator> dp_background;
  bool background_collectives = false;
};

// Every group of size 1, for a single process (needs no MpiRuntime).
ProcessGroups local_process_groups();

// Builds the groups of `layout` for this process: MPI communicators split from the
// world when MpiRuntime was launched (collective: every rank must call it), else
// LocalCommunicators (layout.world_size must then be 1). Needs MpiRuntime::initialize.
ProcessGroups make_process_groups(const Layout& layout);

}  // namespace switchyard
