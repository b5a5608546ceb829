// Which experts the router chose, as a digest two runs can compare: every MoE layer's
// selections per expert and the dropped assignments, counted over the steps since the
// last logged one and summed over micro-batches, data-parallel replicas and pipeline
// stages. Counts are integers, so any layout, thread count or micro-batch split that
// routes the same tokens to the same experts prints the same digest, and a router whose
// near-tie settled otherwise (one token to another expert) prints another.
// metrics.jsonl's `routing_digest`; the layout tests compare runs up to the first step
// whose routing differs (docs/determinism.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "moe/router_stats.h"

namespace switchyard {

class RoutingTally {
 public:
  RoutingTally(int moe_layers, int num_experts);

  // Adds one forward's routing of consecutive MoE layers, the first being the model's MoE
  // layer `first_layer`.
  void add(int first_layer, const RouterStats& rs);

  // The digest of the counts summed over `replicas` and, when given, `stages` (collectives
  // over both), as 16 hex digits; then starts counting afresh.
  std::string take_digest(Communicator& replicas, Communicator* stages);

 private:
  int num_experts_;
  // (layer, expert) selections, then the dropped assignments.
  std::vector<int64_t> counts_;
};

}  // namespace switchyard
