// Routing statistics gathered over every MoE layer of one forward pass: they define the
// load-balancing aux loss (the formula transformers uses for Mixtral, Qwen2-MoE and
// OLMoE, over all layers' router outputs together) and feed the progress report. The
// MoE layers size and fill them: each says its experts, top-k and capacity factor as it
// adds its row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/runtime/tensor.h"

namespace switchyard {

// Per expert the top-k selections and the router probability sums, and the tokens
// routed (tokens x layers), added over a run of MoE layers in depth order: what the
// all-layer aux loss reads. Empty: no layers yet. Beside them the router losses over the
// same layers, added layer by layer as one forward adds them: each layer's balance loss
// (the per-layer aux loss before its mean over layers), z-loss and sequence-wise aux
// loss. So a micro-batch's last pipeline chunk holds the whole model's losses bit for
// bit, added in one process's order.
struct RoutingSums {
  std::vector<double> selections;
  std::vector<double> prob_sums;
  int64_t tokens = 0;
  double layer_aux_sum = 0;
  double z_loss = 0;
  double seq_aux_loss = 0;
};

struct RouterStats {
  int num_experts = 0;
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
  // The sequence-wise aux loss (moe.seq_aux_loss_coef), unweighted: the sum over MoE
  // layers of each layer's sequence_aux_loss.
  double seq_aux_loss = 0;
  // The same sums for each MoE layer, in forward order, with the routing they came from.
  struct Layer {
    std::vector<double> selections_per_expert;
    std::vector<double> prob_sum_per_expert;
    int64_t tokens = 0;
    int top_k = 0;
    float capacity_factor = 0;  // the forward's; <= 0: dropless
    double z_loss = 0;          // the mean z-loss over the layer's tokens
    // The mean over the layer's sequences of E / (k T) * sum_e selections_se *
    // (normalised score sum_se / T), T = seq_len (the sequence's real tokens with
    // sequence_tokens); 0 without sequence sums.
    double sequence_aux_loss = 0;
    int64_t seq_len = 0;  // 0: the layer added no sequence sums
    // Padded windows: each sequence's real tokens, its T (padding is not routed); empty:
    // T = seq_len for every sequence.
    std::vector<int32_t> sequence_tokens{};
  };
  std::vector<Layer> layers;
  // The all-layer aux loss's sums: those of the model's MoE layers before these
  // statistics' (given to begin(): a pipeline chunk's, carried from the chunk before),
  // followed by each of its layers, added as the totals above are. So on the whole model
  // they are the totals, and on a micro-batch's last chunk the whole model's bit for bit.
  // A chunk below the last takes the whole model's before its backward (its forward's
  // stop at its own last layer).
  RoutingSums all_layers;
  // The whole model's MoE layers when these statistics cover a pipeline chunk's (set
  // after begin()); 0: the layers above are all. The per-layer aux loss is a mean over
  // the whole model's layers, so that the chunks' losses and gradients add up to it.
  int model_layers = 0;

  // The routing sums of the forward under way, on its device: one row per MoE layer,
  // (layers, 3E + 1) f32 = selections, probability sums and the z-loss sum over the
  // layer's tokens (router_forward's sums), then the assignments each expert kept (after
  // capacity and GShard's dispatch), all added over the tensor-parallel group. The layers
  // write their rows without waiting for the host; collect() reads them all at once.
  Tensor device_sums;
  // With the sequence-wise aux loss: (layers, sequences x 2E) f32, each layer's
  // kernels/sequence_aux.h sums of every sequence of the batch, added over the
  // tensor-parallel group; collect() reads them with device_sums.
  Tensor sequence_sums;

  // Starts one forward's statistics (reset) with room for `moe_layers` rows on `dev`,
  // the all-layer sums starting from `before` (the MoE layers before these; empty: none).
  void begin(Device& dev, int moe_layers, RoutingSums before = {});
  // Adds a layer of `tokens` tokens routed over `experts` experts (the same for every
  // layer; the first sizes device_sums) to `top_k` each at `capacity_factor`, and
  // returns its row of device_sums to fill.
  Tensor add_layer(int64_t tokens, int experts, int top_k, float capacity_factor);
  // Gives the layer added last a (sequences, 2E) row of sequence_sums to fill, for a
  // batch of `sequences` sequences of `seq_len` tokens (the same for every layer), of
  // which `real_tokens` (when not empty, one per sequence) hold text and the rest padding.
  Tensor add_sequence_sums(int64_t sequences, int64_t seq_len,
                           std::span<const int32_t> real_tokens = {});
  // Reads device_sums back (one host wait) and fills the per-layer and total sums.
  void collect();
  // The statistics of one micro-batch's pipeline chunks (each collected), in depth order,
  // as one forward of the whole model collects them: the layers in order, the sums over
  // them added as collect() adds them, so every total and loss is the whole model's.
  static RouterStats merge(const std::vector<RouterStats>& chunks);
  void reset(int experts);
  // All layers together (transformers' formula): aux = E * sum_e (selections_e / T) *
  // (prob_sum_e / T) over all_layers' sums, T their tokens. Per layer: the mean over
  // layers of the same formula on each layer's sums (all_layers.layer_aux_sum over
  // mean_layers()). A perfect balance gives the layers' top-k either way. Both cover
  // all_layers' layers: on a pipeline chunk, those before it too.
  double aux_loss(bool per_layer) const;
  // d(coef * aux) / d prob[t, e] for every token routed by MoE layer `layer`:
  // coef * E * selections_e / T^2 (all layers together, all_layers' sums), or
  // coef * E * selections_le / T_l^2 / layers (per layer).
  std::vector<float> aux_loss_prob_gradient(double coef, bool per_layer, size_t layer) const;
  // The layers the per-layer aux loss averages over: model_layers, or layers.size().
  double mean_layers() const;

 private:
  // Adds a collected layer's sums to the totals over layers.
  void add_to_totals(const Layer& layer);
  Device* device_ = nullptr;  // where begin() makes the room
  int room_ = 0;              // MoE layers begin() made room for
};

}  // namespace switchyard
