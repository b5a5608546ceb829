// The memory a training rank needs at least before its first step, computed from the
// shapes the model registers without allocating anything: what `train` checks against
// its device and what `train --dry-run` prints for every rank of a layout.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/config/recipe.pb.h"
#include "engine/parallel/topology.h"
#include "engine/runtime/param_store.h"

namespace switchyard {

struct RankMemory {
  int rank = 0;
  int tp_index = 0;
  int ep_index = 0;
  double weights_and_gradients = 0;  // resident values, working copies and gradients
  double optimizer_state = 0;
  double layer_inputs = 0;           // every layer's input kept for backward
  double total() const { return weights_and_gradients + optimizer_state + layer_inputs; }
};

// What a rank holding `params` (its shards, ZeRO residency marked) needs at least.
RankMemory rank_memory_lower_bound(const config::Recipe& recipe, const ParamStore& params,
                                   DType working, int dp_size);

// Every rank of `layout`, from the parameters it would register.
std::vector<RankMemory> plan_rank_memory(const config::Recipe& recipe, const Layout& layout,
                                         DType working);

// One line for `m`: "rank 3 (tp 0, ep 3): at least 12.3 GiB: weights and gradients ...".
std::string describe_rank_memory(const RankMemory& m);

// A need of `bytes` that fits the `available` bytes of `device` but leaves less than a
// tenth of them for the activations beyond the layer inputs, workspaces and
// fragmentation: one warning line; "" otherwise (also when it does not fit: check_fits
// refuses that, and when `available` is unknown, < 0).
std::string tight_fit_warning(const std::string& device, double bytes, double available);

}  // namespace switchyard
