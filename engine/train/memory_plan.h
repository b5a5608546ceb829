// The memory a training rank needs, computed from the shapes the model registers without
// allocating anything: what `train` checks against its device, what `train --dry-run`
// prints for every rank of a layout and what `switchyard plan` ranks layouts by. Each
// term is one of the categories the device's allocator counts (core/runtime/device.h),
// so a run's measured peaks (metrics.jsonl's memory_bytes) can be set against it
// (docs/planning.md).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "engine/parallel/topology.h"

namespace switchyard {

struct RankMemory {
  int rank = 0;
  int tp_index = 0;
  int ep_index = 0;
  int pp_index = 0;            // pipeline stage
  double parameters = 0;       // fp32 values this rank keeps (ZeRO-3: its rows)
  double working_copies = 0;   // bf16 copies of the matrices; ZeRO-3's gathered layer
  double gradients = 0;        // fp32 gradients this rank keeps (ZeRO-2/3: its rows)
  double gradient_buckets = 0; // ZeRO-2/3: whole-layer gradients being reduce-scattered
  double optimizer_state = 0;  // AdamW's two moments (Muon's one momentum) of the parameters
                               // this rank updates
  double activations = 0;      // peak of one micro-batch's forward and backward (over the
                               // others a pipeline schedule holds), or of an evaluation
                               // batch's forward where that is larger, beyond:
  double all_to_all = 0;       // the expert-parallel send and receive buffers at that peak
  double pipeline_buffers = 0; // the gradient received from the next stage, at that peak
  double total() const {
    return parameters + working_copies + gradients + gradient_buckets + optimizer_state +
           activations + all_to_all + pipeline_buffers;
  }
};

// Which replica a rank is among the ranks that hold the same shards, for ZeRO-1's
// assignment of whole parameters to owners; -1: an even share of every parameter.
struct ReplicaIndex {
  int dense = -1;
  int expert = -1;
};

// What a rank of pipeline stage `pp_index` (-1: the stage whose units `params` holds, as
// a trainer's chunks register only theirs) holding `params` (its shards, ZeRO residency
// marked; only the stage's units count) needs at least, with `dp_size` data-parallel
// replicas per stage, for the recipe's micro-batch shape: one micro-batch's activations
// at their peak, on top of what the stage holds from the micro-batches the pipeline
// schedule keeps in flight. At least, since activations assume balanced routing (each
// rank's experts receive top_k rows per routed token) and kernels' workspaces and
// fragmentation come on top.
RankMemory rank_memory_lower_bound(const config::Recipe& recipe, const ParamStore& params,
                                   DType working, int dp_size, ReplicaIndex replica = {},
                                   int pp_index = -1);

// The shards each placement of one model registers, registered once for the many layouts
// of it that `switchyard plan` compares. One cache serves recipes of one model only (the
// same model and moe fields).
class ShardCache {
 public:
  // Every unit of the model as the rank at (tp_index, ep_index) of `layout` registers it.
  const ParamStore& whole_model(const config::Recipe& recipe, const Layout& layout, int tp_index,
                                int ep_index);

 private:
  std::map<std::array<int, 4>, std::unique_ptr<ParamStore>> stores_;
};

// Every rank of `layout`, from the parameters it would register (taken from `cache` when
// given).
std::vector<RankMemory> plan_rank_memory(const config::Recipe& recipe, const Layout& layout,
                                         DType working, ShardCache* cache = nullptr);

// One line for `m`: "rank 3 (stage 0, tp 0, ep 3): at least 12.3 GiB: parameters ...".
std::string describe_rank_memory(const RankMemory& m);

// `m` as a JSON object of bytes: rank, tp_index, ep_index, pp_index, total and every term.
nlohmann::ordered_json rank_memory_json(const RankMemory& m);

// "76.20 GiB", or "13.8 MiB" below a GiB.
std::string size_text(double bytes);

// A need of `bytes` that fits the `available` bytes of `device` but leaves less than a
// tenth of them for workspaces, routing imbalance and fragmentation: one warning line;
// "" otherwise (also when it does not fit: check_fits refuses that, and when
// `available` is unknown, < 0).
std::string tight_fit_warning(const std::string& device, double bytes, double available);

}  // namespace switchyard
