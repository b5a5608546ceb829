// Routing statistics gathered over every MoE layer of one forward pass: they define the
// load-balancing aux loss (the formula transformers uses for Mixtral, Qwen2-MoE and
// OLMoE, over all layers' router outputs together) and feed the progress report.
#pragma once

#include <cstdint>
#include <vector>

namespace switchyard {

struct RouterStats {
  int num_experts = 0;
  int top_k = 0;
  // Summed over layers: top-k selections per expert (before capacity) and router
  // probabilities per expert.
  std::vector<double> selections_per_expert;
  std::vector<double> prob_sum_per_expert;
  int64_t routed_tokens = 0;  // tokens x MoE layers
  double z_loss = 0;          // sum over MoE layers of each layer's mean z-loss
  int64_t assignments = 0;
  int64_t dropped_assignments = 0;
  // Largest (max tokens per expert / mean tokens per expert) over layers, after capacity.
  double worst_load_ratio = 0;

  void reset(int experts, int k);
  // aux = E * sum_e (selections_e / T) * (prob_sum_e / T), T = routed_tokens; a perfect
  // balance gives top_k.
  double aux_loss() const;
  // d(coef * aux) / d prob[t, e] for every routed token: coef * E * selections_e / T^2.
  std::vector<float> aux_loss_prob_gradient(double coef) const;
};

}  // namespace switchyard
