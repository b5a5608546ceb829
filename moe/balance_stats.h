// Expert load-balance statistics of a model's routing (`switchyard bench balance`, and the
// per-layer load the trainer writes to TensorBoard): per-expert load, its spread, the
// assignments that capacity factors would drop, the router losses, and the all-to-all
// traffic an expert-parallel layout would see. Counts accumulate over batches of one
// layer; summaries are computed from the counts.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/moe_layer.h"

namespace switchyard {

// The capacity factors whose dropped fraction is reported.
inline constexpr double kBalanceCapacityFactors[] = {1.0, 1.25, 1.5, 2.0};

// One batch of one layer on the host: n tokens, E experts, top-k.
struct RoutingSample {
  int64_t tokens = 0;
  std::vector<int32_t> expert_ids;  // (n, slots): top-k, or E for expert choice (-1: none)
  std::vector<float> weights;       // (n, slots), the combine weights permute_plan ranks by
  std::vector<float> probs;         // (n, E) softmax
  std::vector<float> logits;        // (n, E) router logits
};

struct BalanceCounts {
  int num_experts = 0;
  int top_k = 0;
  int expert_parallel = 1;  // 1: no all-to-all
  int64_t tokens = 0;
  std::vector<int64_t> selections;  // per expert: top-k choices, before capacity
  std::vector<double> prob_sums;    // per expert: summed router probabilities
  double z_sum = 0;                 // sum over tokens of logsumexp(logits)^2
  std::vector<int64_t> dropped;     // per kBalanceCapacityFactors entry
  // Per rank: rows sent to / received from other ranks (a rank's own rows stay local).
  std::vector<int64_t> sent_rows, received_rows;
};

struct AllToAllStats {
  std::vector<int64_t> sent_bytes, received_bytes;  // per rank
  double sent_imbalance = 0, received_imbalance = 0;  // max / mean
  double imbalance = 0;  // the larger of the two
};

struct BalanceSummary {
  std::vector<int64_t> tokens_per_expert;
  std::vector<double> share;
  double imbalance = 0;  // max / mean tokens per expert
  double cv = 0;         // standard deviation / mean tokens per expert
  double entropy = 0;    // of the shares, nats
  double entropy_fraction = 0;  // entropy / ln E
  std::vector<double> dropped;  // fraction of assignments, per kBalanceCapacityFactors entry
  double aux_loss = 0;
  double z_loss = 0;
  bool has_all_to_all = false;
  AllToAllStats all_to_all;
};

// max / mean of counts (per expert, per rank); 0 when they are empty or all 0.
double max_over_mean(const std::vector<int64_t>& counts);

// A copy of a layer's last routing on the host.
RoutingSample routing_sample(const MoeRouting& routing);

// One MoE layer's load in one forward, from its routing counts (RouterStats::Layer:
// top-k selections per expert and the tokens routed): the tokens per expert before
// capacity, their shares, max/mean, spread and idle experts, and the share of the
// assignments that `capacity_factor` drops (0 when it is <= 0, dropless). An expert over its capacity
// ceil(capacity_factor * tokens * k / E) drops exactly its excess, whichever assignments
// it keeps, so the counts give the layer's drops.
struct LayerLoad {
  std::vector<int64_t> tokens_per_expert;
  std::vector<double> share;  // each expert's fraction of the assignments
  double imbalance = 0;       // max / mean tokens per expert
  double cv = 0;              // standard deviation / mean tokens per expert
  int dead_experts = 0;       // experts given no token
  double dropped_fraction = 0;
};
LayerLoad layer_load(const std::vector<double>& selections_per_expert, int64_t tokens,
                     int top_k, double capacity_factor);
// The same for a layer's routing in a forward, at that forward's top-k and capacity factor.
LayerLoad layer_load(const RouterStats::Layer& layer);

// The colour scale of load heatmaps (the HTML report, TensorBoard's image): white for no
// load, light red (255, 128, 128) for the uniform share 1/E, dark red (155, 0, 0) for
// twice the uniform share or more.
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};
Rgb load_color(double share, int num_experts);

// A layers x experts heatmap of shares (share[l][e], every row of the same length) as an
// RGB image: one cell_pixels square per (layer, expert), rows top-down by layer, with
// one-pixel grey grid lines around every cell.
struct RgbImage {
  int height = 0, width = 0;
  std::vector<uint8_t> rgb;  // height * width * 3, row-major
};
RgbImage load_heatmap(const std::vector<std::vector<double>>& shares, int cell_pixels);

// Expert placement over P expert-parallel ranks: placement[s] is the expert in slot s,
// and rank p holds slots [p * E/P, (p+1) * E/P), so the identity is the contiguous
// placement. `loads[e]`: tokens routed to expert e.
std::vector<int64_t> rank_loads(const std::vector<int64_t>& loads, const std::vector<int>& placement,
                                int ranks);

// A placement that lowers the busiest rank's tokens: the experts, heaviest first, each go
// to the least-loaded rank that still has room for one of its E/P (greedy LPT with equal
// expert counts), kept only where it beats the contiguous placement. `lower_bound` is a
// load no placement's busiest rank can be under: max(ceil(total / P), the heaviest expert
// plus the E/P - 1 lightest others), so advised_max / lower_bound bounds how far the
// advice is from the best placement.
struct PlacementAdvice {
  std::vector<int> placement;
  std::vector<int64_t> contiguous_loads, advised_loads;  // tokens per rank
  int64_t contiguous_max = 0, advised_max = 0, lower_bound = 0;
};
// `ranks` must divide the experts.
PlacementAdvice advise_placement(const std::vector<int64_t>& loads, int ranks);

BalanceCounts make_balance_counts(int num_experts, int top_k, int expert_parallel);

// A batch's assignments as an expert-parallel group of `ranks` dispatches them: its n
// tokens split evenly, in order, over the ranks (rank p routes tokens [p n / P,
// (p+1) n / P)); [p * E + e] counts rank p's assignments to expert e (dropless).
std::vector<int64_t> assignments_by_source(const RoutingSample& sample, int num_experts,
                                           int ranks);

// Adds one batch: selections, probability sums and z-loss terms; the assignments
// permute_plan drops at capacity ceil(cf * n * k / E) for each factor; and, with expert
// parallelism P > 1, the rows each rank exchanges when its assignments_by_source go to
// the ranks holding their experts, rank p experts [p * E/P, (p+1) * E/P) (dropless).
void add_routing(const RoutingSample& sample, BalanceCounts& counts);

// Statistics of one layer; `hidden` sizes the all-to-all rows (bf16: 2 bytes each).
BalanceSummary summarize_balance(const BalanceCounts& counts, int64_t hidden);
// All layers together: counts summed, aux loss over all layers' routing together (as
// training computes it) and z-loss summed over layers.
BalanceSummary summarize_overall(const std::vector<BalanceCounts>& layers, int64_t hidden);

}  // namespace switchyard
