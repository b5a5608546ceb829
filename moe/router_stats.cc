#include "moe/router_stats.h"

#include <algorithm>
#include <utility>

#include "core/runtime/check.h"

namespace switchyard {

void RouterStats::reset(int experts) {
  *this = RouterStats();
  num_experts = experts;
  selections_per_expert.assign(experts, 0.0);
  prob_sum_per_expert.assign(experts, 0.0);
  all_layers = {selections_per_expert, prob_sum_per_expert, 0};
}

void RouterStats::begin(Device& dev, int moe_layers, RoutingSums before) {
  reset(0);
  device_ = &dev;
  room_ = moe_layers;
  all_layers = std::move(before);
}

Tensor RouterStats::add_layer(int64_t tokens, int experts, int k, float capacity_factor) {
  const int64_t row = static_cast<int64_t>(layers.size());
  SY_CHECK_MSG(device_ && row < room_, "RouterStats: more MoE layers than begin() made room for");
  if (row == 0) {
    num_experts = experts;
    selections_per_expert.assign(experts, 0.0);
    prob_sum_per_expert.assign(experts, 0.0);
    if (all_layers.selections.empty()) {
      all_layers.selections = selections_per_expert;
      all_layers.prob_sums = prob_sum_per_expert;
    }
    SY_CHECK_MSG(static_cast<int>(all_layers.selections.size()) == experts &&
                     static_cast<int>(all_layers.prob_sums.size()) == experts,
                 "RouterStats: the sums before these layers route other experts");
    device_sums = Tensor::empty({room_, 3 * static_cast<int64_t>(experts) + 1}, DType::kF32,
                                MemoryKind::kActivations, *device_);
  }
  SY_CHECK_MSG(experts == num_experts, "RouterStats: every MoE layer must route the same experts");
  Layer& layer = layers.emplace_back();
  layer.tokens = tokens;
  layer.top_k = k;
  layer.capacity_factor = capacity_factor;
  return device_sums.slice_rows(row, row + 1).reshape({device_sums.row_size()});
}

Tensor RouterStats::add_sequence_sums(int64_t sequences, int64_t seq_len,
                                      std::span<const int32_t> real_tokens) {
  SY_CHECK_MSG(!layers.empty(), "RouterStats: add_sequence_sums() before add_layer()");
  const int64_t row = static_cast<int64_t>(layers.size()) - 1;
  const int64_t width = sequences * 2 * num_experts;
  if (!sequence_sums.defined())
    sequence_sums = Tensor::empty({room_, width}, DType::kF32, MemoryKind::kActivations, *device_);
  SY_CHECK_MSG(sequence_sums.row_size() == width,
               "RouterStats: every MoE layer must see the same sequences");
  layers.back().seq_len = seq_len;
  layers.back().sequence_tokens.assign(real_tokens.begin(), real_tokens.end());
  return sequence_sums.slice_rows(row, row + 1).reshape({sequences, 2 * int64_t{num_experts}});
}

namespace {
// A layer's sequence-wise aux loss from its (sequences x 2E) sums.
// T is each sequence's real tokens (layer.sequence_tokens), else seq_len.
double sequence_aux_loss(const float* sums, int64_t width, int experts,
                         const RouterStats::Layer& layer) {
  const int64_t sequences = width / (2 * experts);
  if (sequences == 0) return 0.0;
  double sum = 0;
  for (int64_t s = 0; s < sequences; ++s) {
    const double t = static_cast<double>(
        layer.sequence_tokens.empty() ? layer.seq_len
                                      : layer.sequence_tokens[static_cast<size_t>(s)]);
    if (t == 0) continue;  // an empty document's sequence: nothing routed
    const float* row = sums + s * 2 * experts;
    double sequence = 0;
    for (int e = 0; e < experts; ++e) sequence += row[e] * (row[experts + e] / t);
    sum += sequence / t;
  }
  return static_cast<double>(experts) / layer.top_k * sum / static_cast<double>(sequences);
}
}  // namespace

void RouterStats::collect() {
  SY_CHECK_MSG(static_cast<int64_t>(layers.size()) == room_,
               "RouterStats: collect() needs one row from every MoE layer");
  if (layers.empty()) return;
  const Tensor host = device_sums.on_host();
  device_sums = Tensor();
  const Tensor sequence_host = sequence_sums.defined() ? sequence_sums.on_host() : Tensor();
  sequence_sums = Tensor();
  const int E = num_experts;
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& layer = layers[l];
    const float* row = host.data<float>() + l * (3 * E + 1);
    const float* kept_row = row + 2 * E + 1;
    layer.selections_per_expert.assign(row, row + E);
    layer.prob_sum_per_expert.assign(row + E, row + 2 * E);
    if (layer.tokens > 0) layer.z_loss = row[2 * E] / static_cast<double>(layer.tokens);
    if (layer.seq_len > 0) {
      const int64_t width = sequence_host.row_size();
      layer.sequence_aux_loss = sequence_aux_loss(sequence_host.data<float>() + l * width, width,
                                                  E, layer);
    }
    add_to_totals(layer);
    int64_t kept_total = 0, max_kept = 0;
    for (int e = 0; e < E; ++e) {
      const auto kept = static_cast<int64_t>(kept_row[e]);
      kept_total += kept;
      max_kept = std::max(max_kept, kept);
    }
    // Expert choice may keep more than k per token on average (a capacity factor above 1).
    dropped_assignments += std::max<int64_t>(0, layer.tokens * layer.top_k - kept_total);
    if (kept_total > 0)
      worst_load_ratio = std::max(worst_load_ratio, static_cast<double>(max_kept) * E / kept_total);
  }
}

namespace {
double balance_loss(const std::vector<double>& selections, const std::vector<double>& prob_sums,
                    int64_t tokens) {
  if (tokens == 0) return 0.0;
  const double t = static_cast<double>(tokens);
  double sum = 0;
  for (size_t e = 0; e < selections.size(); ++e) sum += (selections[e] / t) * (prob_sums[e] / t);
  return static_cast<double>(selections.size()) * sum;
}
}  // namespace

void RouterStats::add_to_totals(const Layer& layer) {
  z_loss += layer.z_loss;
  seq_aux_loss += layer.sequence_aux_loss;
  routed_tokens += layer.tokens;
  assignments += layer.tokens * layer.top_k;
  all_layers.tokens += layer.tokens;
  all_layers.layer_aux_sum +=
      balance_loss(layer.selections_per_expert, layer.prob_sum_per_expert, layer.tokens);
  all_layers.z_loss += layer.z_loss;
  all_layers.seq_aux_loss += layer.sequence_aux_loss;
  for (int e = 0; e < num_experts; ++e) {
    selections_per_expert[e] += layer.selections_per_expert[e];
    prob_sum_per_expert[e] += layer.prob_sum_per_expert[e];
    all_layers.selections[e] += layer.selections_per_expert[e];
    all_layers.prob_sums[e] += layer.prob_sum_per_expert[e];
  }
}

RouterStats RouterStats::merge(const std::vector<RouterStats>& chunks) {
  RouterStats whole;
  for (const RouterStats& chunk : chunks) {
    if (chunk.layers.empty()) continue;
    if (whole.layers.empty()) whole.reset(chunk.num_experts);
    SY_CHECK_MSG(chunk.num_experts == whole.num_experts,
                 "RouterStats: every MoE layer must route the same experts");
    for (const Layer& layer : chunk.layers) {
      whole.layers.push_back(layer);
      whole.add_to_totals(layer);
    }
    whole.dropped_assignments += chunk.dropped_assignments;
    whole.worst_load_ratio = std::max(whole.worst_load_ratio, chunk.worst_load_ratio);
  }
  return whole;
}

double RouterStats::aux_loss(bool per_layer) const {
  if (!per_layer)
    return balance_loss(all_layers.selections, all_layers.prob_sums, all_layers.tokens);
  const double layers_meant = mean_layers();
  return layers_meant > 0 ? all_layers.layer_aux_sum / layers_meant : 0.0;
}

double RouterStats::mean_layers() const {
  return static_cast<double>(model_layers > 0 ? static_cast<size_t>(model_layers) : layers.size());
}

std::vector<float> RouterStats::aux_loss_prob_gradient(double coef, bool per_layer,
                                                       size_t layer) const {
  std::vector<float> g(num_experts, 0.0f);
  const std::vector<double>& selections =
      per_layer ? layers[layer].selections_per_expert : all_layers.selections;
  const int64_t tokens = per_layer ? layers[layer].tokens : all_layers.tokens;
  if (tokens == 0) return g;
  const double t = static_cast<double>(tokens);
  const double scale = per_layer ? coef / mean_layers() : coef;
  for (int e = 0; e < num_experts; ++e)
    g[e] = static_cast<float>(scale * num_experts * selections[e] / (t * t));
  return g;
}

}  // namespace switchyard
