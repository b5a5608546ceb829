#include "moe/router_stats.h"

namespace switchyard {

void RouterStats::reset(int experts, int k) {
  *this = RouterStats();
  num_experts = experts;
  top_k = k;
  selections_per_expert.assign(experts, 0.0);
  prob_sum_per_expert.assign(experts, 0.0);
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

double RouterStats::aux_loss(bool per_layer) const {
  if (!per_layer) return balance_loss(selections_per_expert, prob_sum_per_expert, routed_tokens);
  if (layers.empty()) return 0.0;
  double sum = 0;
  for (const Layer& l : layers)
    sum += balance_loss(l.selections_per_expert, l.prob_sum_per_expert, l.tokens);
  return sum / static_cast<double>(layers.size());
}

std::vector<float> RouterStats::aux_loss_prob_gradient(double coef, bool per_layer,
                                                       size_t layer) const {
  std::vector<float> g(num_experts, 0.0f);
  const std::vector<double>& selections =
      per_layer ? layers[layer].selections_per_expert : selections_per_expert;
  const int64_t tokens = per_layer ? layers[layer].tokens : routed_tokens;
  if (tokens == 0) return g;
  const double t = static_cast<double>(tokens);
  const double scale = per_layer ? coef / static_cast<double>(layers.size()) : coef;
  for (int e = 0; e < num_experts; ++e)
    g[e] = static_cast<float>(scale * num_experts * selections[e] / (t * t));
  return g;
}

}  // namespace switchyard
