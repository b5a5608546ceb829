// The one map of the training state a rank holds: for every parameter, its value and its
// optimizer state (AdamW's two moments, or Muon's momentum), the rows of each this rank
// keeps and whether this rank writes them into a checkpoint. Checkpoint save, resume (and train.init_from) and the final weights' gather
// all follow it, so no rule of who holds or writes what is written twice.
//
// Who writes: each slice is written once, by the first data-parallel replica (expert
// replicas for experts), by the ZeRO-1 owner of its state, or, for ZeRO-2/3 row shards,
// by every replica for its rows. Rows split by tensor parallelism along dimension 0 are
// written by each tensor-parallel rank; those split along another dimension are gathered
// over the group into whole rows and written by its rank 0, as are tensors it
// replicates; so any layout can load them. Expert rows are saved and read in expert
// order whatever parallel.expert_placement: one slice per run of consecutive experts.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/runtime/param_store.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/zero.h"
#include "engine/parallel/topology.h"

namespace switchyard {

// What a tensor of training state is; its checkpoint key is "<kind>/<parameter name>".
enum class StateKind { kParam, kExpAvg, kExpAvgSq, kMomentum };

// "param", "exp_avg", "exp_avg_sq", "muon_momentum"
std::string state_kind_name(StateKind kind);

// Rows of one tensor of state that this rank holds (none, for a ZeRO-3 rank that owns
// no rows of it; every parameter has its kParam slice).
struct HeldSlice {
  StateKind kind = StateKind::kParam;
  size_t param = 0;       // index in ParamStore::params()
  Tensor rows;            // (rows, ...) of this rank's shard
  int64_t first_row = 0;  // of `rows` within this rank's shard
  // Whether this rank takes part in writing it: it is the replica that writes, gathering
  // over the tensor-parallel group where the shard is split along a dimension past 0.
  bool replica_writes = false;
};

// Reads that fill this rank's slices from tensors saved whole. Dense shards split by
// tensor parallelism along a dimension other than 0 are read as whole rows and cut after
// the reads (cut_tensor_parallel_shards).
struct StateReads {
  std::vector<RowsToRead> reads;
  std::vector<std::tuple<Tensor, int, Tensor>> cuts;  // (whole rows read, dim, shard)
};

class RankStateMap {
 public:
  // `optimizer` null: the parameters' values only (weights, not a checkpoint).
  RankStateMap(ParamStore& params, ZeroShards* zero, int zero_stage,
               AdamWOptimizer* optimizer, ProcessGroups& groups);

  const std::vector<HeldSlice>& slices() const { return slices_; }

  // The slices this rank writes into a checkpoint (a collective over the tensor-parallel
  // group for shards split along a dimension past 0).
  std::vector<SliceToSave> slices_to_save() const;

  // The reads that fill every slice this rank holds; then cut_tensor_parallel_shards.
  StateReads reads() const;
  void cut_tensor_parallel_shards(const StateReads& reads) const;

  // Every parameter's whole value, on the host, by name (collectives: expert shards
  // over the expert-parallel group, tensor-parallel shards over the tensor-parallel
  // group, ZeRO-3 values from their owners).
  std::vector<std::pair<std::string, Tensor>> whole_weights() const;

 private:
  void add(StateKind kind, size_t param, const Tensor& rows, int64_t first_row,
           bool replica_writes);
  // An expert parameter's whole value on the host, experts in order whatever the
  // placement (a collective over the expert-parallel group).
  Tensor experts_in_order(const Param& p) const;

  ParamStore& params_;
  ZeroShards* zero_;
  ProcessGroups& groups_;
  std::vector<HeldSlice> slices_;
};

}  // namespace switchyard
