// Shared by the pipeline model tests (activation stashes, model chunks): small recipes
// of every kind of layer, deterministic micro-batches and bitwise comparisons.
#pragma once

#include <cstring>
#include <string>

#include "core/config/recipe.h"
#include "core/runtime/param_store.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"

namespace switchyard::pipeline_test {

inline constexpr int64_t kVocab = 64;
inline constexpr int64_t kBatch = 2;
inline constexpr int64_t kSeq = 12;

struct Case {
  std::string name;
  std::string model;       // extra model fields
  std::string moe;         // the moe section's fields
  std::string train;       // extra train fields
  bool documents = false;  // document attention (doc_starts)
};

inline config::Recipe recipe_for(const Case& c, int layers) {
  const std::string text = R"(
    name: "pipeline"
    model { vocab_size: 64 hidden_size: 16 num_heads: 4 num_kv_heads: 2 rope_theta: 100
            norm_eps: 1e-5 ffn_hidden_size: 24 init_std: 0.3 num_layers: )" +
                           std::to_string(layers) + " " + c.model + R"( }
    moe { expert_ffn_hidden_size: 12 )" +
                           c.moe + R"( }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 4 seq_len: 12 steps: 1 )" +
                           c.train + R"( }
  )";
  auto recipe = config::parse_recipe(text, "pipeline");
  SY_CHECK_MSG(recipe.ok(), std::string(recipe.status().message()).c_str());
  return *recipe;
}

// One micro-batch: ids, targets (some not scored) and document starts (every window cut
// into documents of `seed`-dependent lengths).
struct MicroBatch {
  Tensor ids, targets, doc_starts;
};

inline MicroBatch micro_batch(uint64_t seed, bool documents) {
  MicroBatch m{Tensor::empty({kBatch, kSeq}, DType::kI32),
               Tensor::empty({kBatch, kSeq}, DType::kI32), Tensor()};
  Rng data(seed);
  for (int64_t i = 0; i < m.ids.numel(); ++i) {
    m.ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(kVocab));
    m.targets.data<int32_t>()[i] = i % 7 == 3 ? -1 : static_cast<int32_t>(data.below(kVocab));
  }
  if (!documents) return m;
  m.doc_starts = Tensor::empty({kBatch, kSeq}, DType::kI32);
  for (int64_t b = 0; b < kBatch; ++b) {
    int64_t begin = 0;
    for (int64_t i = 0; i < kSeq; ++i) {
      if (i > begin && data.below(4) == 0) begin = i;
      m.doc_starts.data<int32_t>()[b * kSeq + i] = static_cast<int32_t>(begin);
    }
  }
  return m;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0;
}

// Norm gains away from one, so that a misplaced norm shows.
inline void perturb_norms(ParamStore& params) {
  for (Param& p : params.params()) {
    if (p.init != ParamInit::kOnes) continue;
    Rng perturb = Rng(5).fork(std::hash<std::string>{}(p.name));
    float* v = p.value.data<float>();
    for (int64_t i = 0; i < p.value.numel(); ++i)
      v[i] = 1.0f + 0.2f * static_cast<float>(perturb.uniform() - 0.5);
  }
}

// The recipes every pipeline model test runs: dense and MoE layers, recomputation,
// latent attention, documents, GShard's random dispatch and a capacity with the
// sequence-wise aux loss; and transformers' aux loss over all layers together, whose sums
// the chunks carry.
inline const Case kCases[] = {
    {"dense_moe", "first_dense_layers: 1 qk_norm: true",
     "num_experts: 4 top_k: 2 gating: TOP_K aux_loss_coef: 0.1 z_loss_coef: 0.01 "
     "aux_loss_per_layer: true num_shared_experts: 1 shared_expert_ffn_hidden_size: 8 "
     "shared_expert_gate: true",
     "", false},
    {"selective", "first_dense_layers: 1",
     "num_experts: 4 top_k: 2 aux_loss_coef: 0.1 aux_loss_per_layer: true z_loss_coef: 0.01",
     "recompute: SELECTIVE", false},
    {"full", "first_dense_layers: 1",
     "num_experts: 4 top_k: 2 gating: GSHARD_TOP2 capacity_factor: 1.0 aux_loss_coef: 0.1 "
     "aux_loss_per_layer: true",
     "recompute: FULL", false},
    {"mla",
     "first_dense_layers: 1 mla { q_lora_rank: 12 kv_lora_rank: 10 "
     "qk_nope_head_dim: 6 qk_rope_head_dim: 4 v_head_dim: 8 }",
     "num_experts: 8 top_k: 2 gating: TOP_K score_function: SIGMOID num_groups: 4 top_groups: 2 "
     "renormalize: true z_loss_coef: 0.01 aux_loss_per_layer: true num_shared_experts: 1 "
     "shared_expert_ffn_hidden_size: 8",
     "", false},
    {"documents", "first_dense_layers: 1",
     "num_experts: 4 top_k: 2 aux_loss_coef: 0.1 aux_loss_per_layer: true z_loss_coef: 0.01", "",
     true},
    {"gshard_capacity", "qk_head_norm: true head_dim: 8",
     "num_experts: 4 top_k: 2 gating: GSHARD_TOP2 capacity_factor: 1.0 aux_loss_coef: 0.1 "
     "aux_loss_per_layer: true z_loss_coef: 0.01 seq_aux_loss_coef: 0.01",
     "", false},
    {"all_layer_aux", "first_dense_layers: 1",
     "num_experts: 4 top_k: 2 aux_loss_coef: 0.1 z_loss_coef: 0.01", "recompute: FULL", false},
    {"all_layer_gshard", "",
     "num_experts: 4 top_k: 2 gating: GSHARD_TOP2 capacity_factor: 1.0 aux_loss_coef: 0.1",
     "", true},
};

}  // namespace switchyard::pipeline_test
