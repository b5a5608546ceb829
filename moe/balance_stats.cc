#include "moe/balance_stats.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <type_traits>

#include "core/runtime/check.h"
#include "core/runtime/device.h"
#include "core/runtime/tensor.h"
#include "kernels/permute.h"
#include "moe/capacity.h"
#include "moe/replica_plan.h"
#include "moe/router_stats.h"

namespace switchyard {

namespace {

constexpr int kNumCapacityFactors = static_cast<int>(std::size(kBalanceCapacityFactors));
constexpr int64_t kBytesPerElement = 2;  // bf16 activations on the wire

// Assignments of one batch that permute_plan drops at capacity
// ceil(capacity_factor * n * k / E), keeping the highest-weight ones as the layer does.
int64_t dropped_assignments(const RoutingSample& s, int num_experts, int slots, int top_k,
                            double capacity_factor) {
  const int64_t capacity =
      expert_capacity(static_cast<float>(capacity_factor), s.tokens, top_k, num_experts);
  Tensor ids = Tensor::empty({s.tokens, slots}, DType::kI32);
  Tensor weights = Tensor::empty({s.tokens, slots});
  std::copy(s.expert_ids.begin(), s.expert_ids.end(), ids.data<int32_t>());
  std::copy(s.weights.begin(), s.weights.end(), weights.data<float>());
  Tensor tokens_per_expert = Tensor::empty({num_experts}, DType::kI32);
  Tensor dest_rows = Tensor::empty({s.tokens, slots}, DType::kI32);
  permute_plan(cpu_device(), ids, weights, num_experts, capacity, tokens_per_expert, dest_rows);
  int64_t sent = 0, kept = 0;
  for (const int32_t e : s.expert_ids) sent += e >= 0;
  for (int e = 0; e < num_experts; ++e) kept += tokens_per_expert.data<int32_t>()[e];
  return sent - kept;
}

// Standard deviation / mean of the counts; 0 when they are all 0.
double coefficient_of_variation(const std::vector<int64_t>& v) {
  double sum = 0;
  for (int64_t x : v) sum += static_cast<double>(x);
  if (v.empty() || sum <= 0) return 0;
  const double mean = sum / static_cast<double>(v.size());
  double var = 0;
  for (int64_t x : v) var += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
  return std::sqrt(var / static_cast<double>(v.size())) / mean;
}

void merge(const BalanceCounts& from, BalanceCounts& into) {
  into.tokens += from.tokens;
  into.z_sum += from.z_sum;
  for (int e = 0; e < from.num_experts; ++e) {
    into.selections[e] += from.selections[e];
    into.prob_sums[e] += from.prob_sums[e];
  }
  for (int c = 0; c < kNumCapacityFactors; ++c) into.dropped[c] += from.dropped[c];
  for (int p = 0; p < from.expert_parallel; ++p) {
    into.sent_rows[p] += from.sent_rows[p];
    into.received_rows[p] += from.received_rows[p];
  }
}

constexpr uint8_t kGridGrey = 204;

}  // namespace

double max_over_mean(const std::vector<int64_t>& v) {
  if (v.empty()) return 0;
  double sum = 0, max = 0;
  for (int64_t x : v) {
    sum += static_cast<double>(x);
    max = std::max(max, static_cast<double>(x));
  }
  return sum > 0 ? max * static_cast<double>(v.size()) / sum : 0;
}

RoutingSample routing_sample(const MoeRouting& r) {
  RoutingSample s;
  s.tokens = r.probs.rows();
  auto host_values = [](const Tensor& t, auto& out) {
    using T = typename std::decay_t<decltype(out)>::value_type;
    const Tensor host = t.on_host();
    out.assign(host.data<T>(), host.data<T>() + host.numel());
  };
  host_values(r.expert_ids, s.expert_ids);
  host_values(r.weights, s.weights);
  host_values(r.probs, s.probs);
  host_values(r.logits, s.logits);
  return s;
}

LayerLoad layer_load(const std::vector<double>& selections_per_expert, int64_t tokens,
                     int top_k, double capacity_factor) {
  const int E = static_cast<int>(selections_per_expert.size());
  LayerLoad load;
  int64_t selected = 0;
  for (double x : selections_per_expert) {
    load.tokens_per_expert.push_back(std::llround(x));
    selected += load.tokens_per_expert.back();
  }
  load.share.assign(E, 0.0);
  for (int e = 0; e < E && selected > 0; ++e)
    load.share[e] = static_cast<double>(load.tokens_per_expert[e]) / static_cast<double>(selected);
  load.imbalance = max_over_mean(load.tokens_per_expert);
  load.cv = coefficient_of_variation(load.tokens_per_expert);
  load.dead_experts = std::count(load.tokens_per_expert.begin(), load.tokens_per_expert.end(), 0);
  const int64_t assignments = tokens * top_k;
  if (capacity_factor > 0 && assignments > 0 && E > 0) {
    const int64_t capacity = expert_capacity(static_cast<float>(capacity_factor), tokens, top_k, E);
    int64_t dropped = 0;
    for (int64_t x : load.tokens_per_expert) dropped += std::max<int64_t>(0, x - capacity);
    load.dropped_fraction = static_cast<double>(dropped) / static_cast<double>(assignments);
  }
  return load;
}

LayerLoad layer_load(const RouterStats::Layer& layer) {
  return layer_load(layer.selections_per_expert, layer.tokens, layer.top_k, layer.capacity_factor);
}

Rgb load_color(double share, int num_experts) {
  const double t = std::clamp(share * num_experts / 2.0, 0.0, 1.0);
  Rgb c;
  c.r = static_cast<uint8_t>(std::lround(255 - 100 * std::max(0.0, t - 0.5) * 2));
  c.g = c.b = static_cast<uint8_t>(std::lround(255 * (1 - t)));
  return c;
}

RgbImage load_heatmap(const std::vector<std::vector<double>>& shares, int cell_pixels) {
  RgbImage image;
  if (shares.empty() || shares[0].empty() || cell_pixels < 1) return image;
  const int layers = static_cast<int>(shares.size());
  const int experts = static_cast<int>(shares[0].size());
  image.height = layers * cell_pixels + 1;
  image.width = experts * cell_pixels + 1;
  image.rgb.assign(static_cast<size_t>(image.height) * image.width * 3, kGridGrey);
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      const Rgb c = load_color(shares[l][e], experts);
      for (int y = l * cell_pixels + 1; y < (l + 1) * cell_pixels; ++y) {
        for (int x = e * cell_pixels + 1; x < (e + 1) * cell_pixels; ++x) {
          uint8_t* p = &image.rgb[(static_cast<size_t>(y) * image.width + x) * 3];
          p[0] = c.r;
          p[1] = c.g;
          p[2] = c.b;
        }
      }
    }
  }
  return image;
}

std::vector<int64_t> rank_loads(const std::vector<int64_t>& loads, const std::vector<int>& placement,
                                int ranks) {
  std::vector<int64_t> per_rank(ranks, 0);
  const size_t per = placement.size() / static_cast<size_t>(ranks);
  for (size_t s = 0; s < placement.size(); ++s) per_rank[s / per] += loads[placement[s]];
  return per_rank;
}

PlacementAdvice advise_placement(const std::vector<int64_t>& loads, int ranks) {
  const int E = static_cast<int>(loads.size());
  SY_CHECK_MSG(E > 0 && ranks > 0 && E % ranks == 0,
               "advise_placement: the ranks must divide the experts");
  const int per = E / ranks;
  PlacementAdvice a;
  std::vector<int> contiguous(E);
  std::iota(contiguous.begin(), contiguous.end(), 0);
  a.contiguous_loads = rank_loads(loads, contiguous, ranks);
  a.contiguous_max = *std::max_element(a.contiguous_loads.begin(), a.contiguous_loads.end());

  std::vector<int> order = contiguous;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return loads[x] > loads[y]; });
  std::vector<std::vector<int>> held(ranks);
  std::vector<int64_t> load(ranks, 0);
  for (int e : order) {
    int best = -1;
    for (int p = 0; p < ranks; ++p)
      if (static_cast<int>(held[p].size()) < per && (best < 0 || load[p] < load[best])) best = p;
    held[best].push_back(e);
    load[best] += loads[e];
  }
  for (std::vector<int>& experts : held) {
    std::sort(experts.begin(), experts.end());
    a.placement.insert(a.placement.end(), experts.begin(), experts.end());
  }
  a.advised_loads = rank_loads(loads, a.placement, ranks);
  a.advised_max = *std::max_element(a.advised_loads.begin(), a.advised_loads.end());
  if (a.advised_max >= a.contiguous_max) {
    a.placement = contiguous;
    a.advised_loads = a.contiguous_loads;
    a.advised_max = a.contiguous_max;
  }
  // The rank holding the heaviest expert holds E/P - 1 others, at least the lightest ones.
  std::vector<int64_t> ascending = loads;
  std::sort(ascending.begin(), ascending.end());
  const int64_t heaviest_rank =
      ascending.back() + std::accumulate(ascending.begin(), ascending.begin() + (per - 1), int64_t{0});
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
  a.lower_bound = std::max((total + ranks - 1) / ranks, heaviest_rank);
  return a;
}

BalanceCounts make_balance_counts(int num_experts, int top_k, int expert_parallel) {
  BalanceCounts c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.expert_parallel = expert_parallel;
  c.selections.assign(num_experts, 0);
  c.prob_sums.assign(num_experts, 0.0);
  c.dropped.assign(kNumCapacityFactors, 0);
  c.sent_rows.assign(expert_parallel, 0);
  c.received_rows.assign(expert_parallel, 0);
  return c;
}

std::vector<int64_t> assignments_by_source(const RoutingSample& s, int num_experts, int ranks) {
  const int64_t n = s.tokens;
  const int k = n > 0 ? static_cast<int>(s.expert_ids.size() / n) : 0;
  std::vector<int64_t> by_source(static_cast<size_t>(ranks) * num_experts, 0);
  for (int src = 0; src < ranks; ++src) {
    for (int64_t t = src * n / ranks; t < (src + 1) * n / ranks; ++t) {
      for (int j = 0; j < k; ++j) {
        const int32_t e = s.expert_ids[t * k + j];
        if (e >= 0) ++by_source[static_cast<size_t>(src) * num_experts + e];
      }
    }
  }
  return by_source;
}

void add_routing(const RoutingSample& s, BalanceCounts& c) {
  const int E = c.num_experts;
  const int64_t n = s.tokens;
  // Assignment slots per token: top-k, or one per expert for expert choice.
  const int k = n > 0 ? static_cast<int>(s.expert_ids.size() / n) : c.top_k;
  c.tokens += n;
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = s.expert_ids[t * k + j];
      if (e >= 0) ++c.selections[e];
    }
    const float* probs = &s.probs[t * E];
    const float* logits = &s.logits[t * E];
    double max_logit = logits[0];
    for (int e = 0; e < E; ++e) {
      c.prob_sums[e] += probs[e];
      max_logit = std::max<double>(max_logit, logits[e]);
    }
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(logits[e] - max_logit);
    const double lse = max_logit + std::log(z);
    c.z_sum += lse * lse;
  }
  for (int i = 0; i < kNumCapacityFactors; ++i)
    c.dropped[i] += dropped_assignments(s, E, k, c.top_k, kBalanceCapacityFactors[i]);
  const int P = c.expert_parallel;
  if (P > 1) {
    std::vector<int> contiguous(E);
    std::iota(contiguous.begin(), contiguous.end(), 0);
    const DispatchRows rows =
        dispatch_rows(owner_plan(contiguous, P), assignments_by_source(s, E, P));
    for (int p = 0; p < P; ++p) {
      c.sent_rows[p] += rows.sent[p];
      c.received_rows[p] += rows.received[p];
    }
  }
}

BalanceSummary summarize_balance(const BalanceCounts& c, int64_t hidden) {
  const int E = c.num_experts;
  BalanceSummary s;
  s.tokens_per_expert = c.selections;
  double total = 0;
  for (int64_t x : c.selections) total += static_cast<double>(x);
  s.share.assign(E, 0.0);
  if (total > 0) {
    for (int e = 0; e < E; ++e) {
      s.share[e] = static_cast<double>(c.selections[e]) / total;
      if (s.share[e] > 0) s.entropy -= s.share[e] * std::log(s.share[e]);
    }
  }
  s.cv = coefficient_of_variation(c.selections);
  s.imbalance = max_over_mean(c.selections);
  s.entropy_fraction = E > 1 ? s.entropy / std::log(static_cast<double>(E)) : 1.0;

  const double assignments = static_cast<double>(c.tokens) * c.top_k;
  for (int64_t d : c.dropped)
    s.dropped.push_back(assignments > 0 ? static_cast<double>(d) / assignments : 0.0);

  RouterStats router;
  router.reset(E);
  for (int e = 0; e < E; ++e) {
    router.selections_per_expert[e] = static_cast<double>(c.selections[e]);
    router.prob_sum_per_expert[e] = c.prob_sums[e];
  }
  router.routed_tokens = c.tokens;
  router.all_layers = {router.selections_per_expert, router.prob_sum_per_expert, c.tokens};
  s.aux_loss = router.aux_loss(/*per_layer=*/false);
  s.z_loss = c.tokens > 0 ? c.z_sum / static_cast<double>(c.tokens) : 0.0;

  if (c.expert_parallel > 1) {
    s.has_all_to_all = true;
    AllToAllStats& a = s.all_to_all;
    for (int p = 0; p < c.expert_parallel; ++p) {
      a.sent_bytes.push_back(c.sent_rows[p] * hidden * kBytesPerElement);
      a.received_bytes.push_back(c.received_rows[p] * hidden * kBytesPerElement);
    }
    a.sent_imbalance = max_over_mean(a.sent_bytes);
    a.received_imbalance = max_over_mean(a.received_bytes);
    a.imbalance = std::max(a.sent_imbalance, a.received_imbalance);
  }
  return s;
}

BalanceSummary summarize_overall(const std::vector<BalanceCounts>& layers, int64_t hidden) {
  if (layers.empty()) return BalanceSummary();
  BalanceCounts all =
      make_balance_counts(layers[0].num_experts, layers[0].top_k, layers[0].expert_parallel);
  double z_loss = 0;
  for (const BalanceCounts& layer : layers) {
    merge(layer, all);
    if (layer.tokens > 0) z_loss += layer.z_sum / static_cast<double>(layer.tokens);
  }
  BalanceSummary s = summarize_balance(all, hidden);
  s.z_loss = z_loss;
  return s;
}

}  // namespace switchyard
