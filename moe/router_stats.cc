#include "moe/router_stats.h"

namespace switchyard {

void RouterStats::reset(int experts, int k) {
  *this = RouterStats();
  num_experts = experts;
  top_k = k;
  selections_per_expert.assign(experts, 0.0);
  prob_sum_per_expert.assign(experts, 0.0);
}

double RouterStats::aux_loss() const {
  if (routed_tokens == 0) return 0.0;
  const double t = static_cast<double>(routed_tokens);
  double sum = 0;
  for (int e = 0; e < num_experts; ++e)
    sum += (selections_per_expert[e] / t) * (prob_sum_per_expert[e] / t);
  return num_experts * sum;
}

std::vector<float> RouterStats::aux_loss_prob_gradient(double coef) const {
  std::vector<float> g(num_experts, 0.0f);
  if (routed_tokens == 0) return g;
  const double t = static_cast<double>(routed_tokens);
  for (int e = 0; e < num_experts; ++e)
    g[e] = static_cast<float>(coef * num_experts * selections_per_expert[e] / (t * t));
  return g;
}

}  // namespace switchyard
