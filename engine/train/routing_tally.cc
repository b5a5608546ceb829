#include "engine/train/routing_tally.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace switchyard {

RoutingTally::RoutingTally(int moe_layers, int num_experts)
    : num_experts_(num_experts),
      counts_(static_cast<size_t>(moe_layers) * num_experts + 1, 0) {}

void RoutingTally::add(int first_layer, const RouterStats& rs) {
  for (size_t l = 0; l < rs.layers.size(); ++l) {
    const std::vector<double>& selections = rs.layers[l].selections_per_expert;
    const size_t row = (static_cast<size_t>(first_layer) + l) * num_experts_;
    for (int e = 0; e < num_experts_ && e < static_cast<int>(selections.size()); ++e)
      counts_[row + e] += std::llround(selections[e]);
  }
  counts_.back() += rs.dropped_assignments;
}

std::string RoutingTally::take_digest(Communicator& replicas, Communicator* stages) {
  const auto n = static_cast<int64_t>(counts_.size());
  replicas.all_reduce_sum(counts_.data(), n);
  if (stages != nullptr) stages->all_reduce_sum(counts_.data(), n);
  // FNV-1a over the counts' bytes, least significant first.
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (int64_t count : counts_) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (static_cast<uint64_t>(count) >> (8 * byte)) & 0xff;
      hash *= 0x100000001b3ULL;
    }
  }
  std::fill(counts_.begin(), counts_.end(), 0);
  return absl::StrFormat("%016x", hash);
}

}  // namespace switchyard
