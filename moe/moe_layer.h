// One MoE FFN layer on a single rank: router -> gating -> capacity -> permute ->
// grouped SwiGLU experts -> unpermute/combine, plus optional shared experts.
#pragma once

#include <memory>
#include <string>

#include "engine/config/recipe.pb.h"
#include "engine/runtime/param_store.h"
#include "engine/runtime/rng.h"
#include "engine/runtime/tensor.h"
#include "moe/router_stats.h"
#include "moe/swiglu_ffn.h"

namespace switchyard {

class MoeLayer {
 public:
  MoeLayer(ParamStore& params, const std::string& prefix, const config::ModelConfig& model,
           const config::MoeConfig& moe);

  // x: (n, hidden) -> (n, hidden). Adds this layer's routing to `stats`. `rng` drives
  // GShard's random second-expert dispatch during training.
  Tensor forward(Device& dev, const Tensor& x, bool training, Rng& rng, RouterStats& stats);
  // dy: (n, hidden) -> dx. `aux_prob_grad` (E) is the gradient of the weighted aux loss
  // with respect to each token's router probabilities, `z_loss_scale` the weight of this
  // layer's z-loss in the total loss.
  Tensor backward(Device& dev, const Tensor& dy, const Tensor& aux_prob_grad, float z_loss_scale);

  int num_experts() const { return num_experts_; }

 private:
  int num_experts_;
  int top_k_;
  config::Gating gating_;
  float capacity_factor_;
  Param* router_;      // (E, hidden)
  Param* gate_up_;     // (E, 2 * ffn, hidden), gate rows first
  Param* down_;        // (E, hidden, ffn)
  std::unique_ptr<SwigluFfn> shared_;
  Param* shared_gate_ = nullptr;  // (1, hidden)

  // Saved for backward.
  Tensor x_;                  // (n, hidden)
  Tensor probs_;              // (n, E)
  Tensor router_logits_;      // (n, E)
  Tensor expert_ids_;         // (n, k)
  Tensor weights_;            // (n, k)
  Tensor tokens_per_expert_;  // (E)
  Tensor dest_rows_;          // (n, k)
  Tensor xp_;                 // (rows, hidden) permuted tokens
  Tensor gate_up_out_;        // (rows, 2 * ffn)
  Tensor act_;                // (rows, ffn)
  Tensor expert_out_;         // (rows, hidden)
  Tensor shared_out_;         // (n, hidden)
  Tensor shared_gate_logit_;  // (n, 1)
};

}  // namespace switchyard
