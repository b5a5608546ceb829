// Loss-free balancing (moe.bias_update_rate, DeepSeek-V3): the sigmoid router chooses
// experts by score + a per-expert bias, and after every optimizer step each bias moves
// by rate * sign(mean load - load), so an overloaded expert is chosen less and an idle
// one more, with no loss term and no gradient. The load is that of the whole global
// batch: every micro-batch of the step on every data-parallel rank (and every expert-
// and tensor-parallel rank of it), summed before the update, so the update is the same
// whatever the layout and the micro-batch size. With pipeline stages each stage keeps
// the loads of its own layers only and updates their biases.
#pragma once

#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"
#include "moe/router_stats.h"

namespace switchyard {

class ExpertBiasBalancer {
 public:
  ExpertBiasBalancer(float rate, int num_experts);

  // Adds one forward's top-k selections per expert, layer by layer (after each of the
  // step's micro-batches on this rank): the forwards of one model, or of one pipeline
  // chunk, whose MoE layers (none at all in a chunk of dense layers) the balancer keeps.
  void add(const RouterStats& stats);
  // Collective over `data_parallel`: the step's update of each MoE layer's bias,
  // (layers, E), from the loads summed over the group; then starts the next step. Every
  // rank gets the same values.
  std::vector<std::vector<float>> take_updates(Communicator& data_parallel);

 private:
  float rate_;
  int num_experts_;
  std::vector<double> loads_;  // (layers x E): this rank's selections in the step so far
};

// rate * sign(mean - load_e) for each expert of one layer's loads (exact ties move nothing).
std::vector<float> bias_update(const std::vector<double>& loads, float rate);

// rows (f32, any device) holds elements [first_row, first_row + rows) of a bias; adds
// their part of `update`.
void add_bias_update(Tensor& rows, int64_t first_row, const std::vector<float>& update);

}  // namespace switchyard
