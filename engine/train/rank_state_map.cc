#include "engine/train/rank_state_map.h"

#include "engine/parallel/tensor_shards.h"

namespace switchyard {

namespace {

// Dense parameters that tensor parallelism splits (experts split over ep instead).
bool split_over_tp(const Param& p) { return !p.spec.expert && p.shape != p.whole_shape; }

std::string state_key(StateKind kind, const Param& p) {
  return state_kind_name(kind) + "/" + p.name;
}

// Rows [first, first + count) of a held slice, whole-tensor rows [whole_first, ...).
struct RowRun {
  int64_t first = 0, count = 0, whole_first = 0;
};

// A held slice of an expert shard as runs of consecutive whole-tensor rows: one run in
// expert order, one per run of consecutive experts under a placement.
std::vector<RowRun> whole_row_runs(const Param& p, const HeldSlice& slice) {
  std::vector<RowRun> runs;
  for (int64_t r = 0; r < slice.rows.dim(0); ++r) {
    const int64_t whole = p.whole_row(slice.first_row + r);
    if (!runs.empty() && runs.back().whole_first + runs.back().count == whole)
      ++runs.back().count;
    else
      runs.push_back({r, 1, whole});
  }
  return runs;
}

Tensor run_rows(const Tensor& rows, const RowRun& run) {
  return rows.slice_rows(run.first, run.first + run.count);
}

}  // namespace

std::string state_kind_name(StateKind kind) {
  switch (kind) {
    case StateKind::kParam: return "param";
    case StateKind::kExpAvg: return "exp_avg";
    case StateKind::kExpAvgSq: return "exp_avg_sq";
    case StateKind::kMomentum: return "muon_momentum";
  }
  return "";
}

RankStateMap::RankStateMap(ParamStore& params, ZeroShards* zero, int zero_stage,
                           AdamWOptimizer* optimizer, ProcessGroups& groups)
    : params_(params), zero_(zero), groups_(groups) {
  for (size_t i = 0; i < params.params().size(); ++i) {
    Param& p = params.params()[i];
    const Communicator& replicas = p.spec.expert ? *groups.expert_dp : *groups.dp;
    const bool first_replica = replicas.rank() == 0;
    if (zero && zero->is_sharded(i)) {
      ZeroShards::Shard& shard = zero->shard(i);
      if (zero_stage == 3) add(StateKind::kParam, i, shard.value, shard.first_row, true);
      else add(StateKind::kParam, i, p.value, 0, first_replica);
      if (!optimizer) continue;
      if (optimizer->trained_by_muon(i)) {
        add(StateKind::kMomentum, i, shard.momentum, shard.first_row, true);
        continue;
      }
      add(StateKind::kExpAvg, i, shard.exp_avg, shard.first_row, true);
      add(StateKind::kExpAvgSq, i, shard.exp_avg_sq, shard.first_row, true);
      continue;
    }
    add(StateKind::kParam, i, p.value, 0, first_replica);
    if (!optimizer || !optimizer->holds_state(i)) continue;
    const int owner = optimizer->owner(i);
    const bool writes_state = replicas.rank() == (owner < 0 ? 0 : owner);
    if (optimizer->trained_by_muon(i)) {
      add(StateKind::kMomentum, i, optimizer->momentum(i), 0, writes_state);
      continue;
    }
    add(StateKind::kExpAvg, i, optimizer->exp_avg(i), 0, writes_state);
    add(StateKind::kExpAvgSq, i, optimizer->exp_avg_sq(i), 0, writes_state);
  }
}

void RankStateMap::add(StateKind kind, size_t param, const Tensor& rows, int64_t first_row,
                       bool replica_writes) {
  slices_.push_back({kind, param, rows, first_row, replica_writes});
}

std::vector<SliceToSave> RankStateMap::slices_to_save() const {
  std::vector<SliceToSave> mine;
  for (const HeldSlice& slice : slices_) {
    if (!slice.replica_writes || slice.rows.numel() == 0) continue;
    const Param& p = params_.params()[slice.param];
    if (p.spec.expert) {
      for (const RowRun& run : whole_row_runs(p, slice))
        mine.push_back(SliceToSave{state_key(slice.kind, p), run_rows(slice.rows, run).on_host(),
                                   p.whole_shape, true, p.spec.tensor_parallel_dim,
                                   run.whole_first});
      continue;
    }
    const int dim = p.spec.tensor_parallel_dim;
    const bool split = split_over_tp(p);
    const Tensor saved =
        split && dim > 0 ? gather_shards(*groups_.tp, slice.rows, dim) : slice.rows;
    if ((split && dim == 0) || groups_.tp->rank() == 0)
      mine.push_back(SliceToSave{state_key(slice.kind, p), saved.on_host(), p.whole_shape,
                                 p.spec.expert, dim, p.origin[0] + slice.first_row});
  }
  return mine;
}

StateReads RankStateMap::reads() const {
  StateReads plan;
  for (const HeldSlice& slice : slices_) {
    if (slice.rows.numel() == 0) continue;
    const Param& p = params_.params()[slice.param];
    const std::string key = state_key(slice.kind, p);
    if (p.spec.expert) {
      for (const RowRun& run : whole_row_runs(p, slice))
        plan.reads.push_back({key, run.whole_first, run_rows(slice.rows, run)});
      continue;
    }
    const int dim = p.spec.tensor_parallel_dim;
    if (!split_over_tp(p) || dim == 0) {
      plan.reads.push_back({key, p.origin[0] + slice.first_row, slice.rows});
      continue;
    }
    Shape shape = p.whole_shape;
    shape[0] = slice.rows.dim(0);
    plan.reads.push_back({key, slice.first_row, Tensor::empty(shape)});
    plan.cuts.emplace_back(plan.reads.back().out, dim, slice.rows);
  }
  return plan;
}

void RankStateMap::cut_tensor_parallel_shards(const StateReads& reads) const {
  Communicator& tp = *groups_.tp;
  for (auto [whole, dim, shard] : reads.cuts) copy_shard(whole, dim, tp.rank(), tp.size(), shard);
}

std::vector<std::pair<std::string, Tensor>> RankStateMap::whole_weights() const {
  std::vector<std::pair<std::string, Tensor>> whole;
  for (const HeldSlice& slice : slices_) {
    if (slice.kind != StateKind::kParam) continue;
    Param& p = params_.params()[slice.param];
    if (p.spec.expert) {
      whole.emplace_back(p.name, experts_in_order(p));
      continue;
    }
    // At ZeRO stage 3 the value comes from its owner first. The weights file is written
    // from host memory.
    const Tensor value = zero_ ? zero_->whole_value(p) : p.value;
    whole.emplace_back(p.name, split_over_tp(p)
                                   ? gather_shards(*groups_.tp, value, p.spec.tensor_parallel_dim)
                                   : value.on_host());
  }
  return whole;
}

Tensor RankStateMap::experts_in_order(const Param& p) const {
  const Tensor placed = gather_shards(*groups_.ep, p.value, 0);
  if (p.whole_rows.empty()) return placed;
  // Position i of the gathered shards holds expert order[i]; every rank knows them all.
  const std::vector<int>& order = params_.placement().expert_order;
  Tensor whole = Tensor::empty(placed.shape());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t position = static_cast<int64_t>(i);
    whole.slice_rows(order[i], order[i] + 1).copy_from(placed.slice_rows(position, position + 1));
  }
  return whole;
}

}  // namespace switchyard
