// The small MoE layer the layer tests run: 4 experts, top-2, width 6, expert FFN width 3,
// weights drawn with std 0.5, one routing group and no routed scaling; and its inputs,
// normal random rows.
#pragma once

#include <cstdint>

#include "core/config/recipe.pb.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"

namespace switchyard::testing {

inline constexpr int kSmallLayerExperts = 4;
inline constexpr int kSmallLayerTopK = 2;
inline constexpr int64_t kSmallLayerHidden = 6;

// The routings the layer tests run: the selection, the score function and whether the
// chosen weights are renormalised.
struct Routing {
  config::Gating gating = config::TOP_K;
  config::ScoreFunction score_function = config::SOFTMAX;
  bool renormalize = true;
};
inline constexpr Routing kSoftmaxRenormalized{};
inline constexpr Routing kSoftmax{.renormalize = false};
inline constexpr Routing kSigmoid{.score_function = config::SIGMOID, .renormalize = false};
inline constexpr Routing kExpertChoice{.gating = config::EXPERT_CHOICE, .renormalize = false};

struct SmallLayerConfig {
  config::ModelConfig model;
  config::MoeConfig moe;
};

inline SmallLayerConfig small_layer_config(Routing routing, float capacity_factor,
                                           float seq_aux_loss_coef) {
  SmallLayerConfig s;
  s.model.set_hidden_size(kSmallLayerHidden);
  s.model.set_init_std(0.5f);
  s.moe.set_num_experts(kSmallLayerExperts);
  s.moe.set_top_k(kSmallLayerTopK);
  s.moe.set_gating(routing.gating);
  s.moe.set_score_function(routing.score_function);
  s.moe.set_renormalize(routing.renormalize);
  s.moe.set_expert_ffn_hidden_size(3);
  s.moe.set_routed_scaling_factor(1.0f);
  s.moe.set_num_groups(1);
  s.moe.set_top_groups(1);
  s.moe.set_capacity_factor(capacity_factor);
  s.moe.set_seq_aux_loss_coef(seq_aux_loss_coef);
  return s;
}

// An f32 host tensor of normal values times `scale`.
inline Tensor normal_tensor(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(scale * rng.normal());
  return t;
}

}  // namespace switchyard::testing
