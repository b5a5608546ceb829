#include "engine/model/model_stats.h"

#include <string>

#include "engine/model/transformer.h"

namespace switchyard {
namespace {

// The kind of work whose products multiply by matrix `p` (core/runtime/op_clock.h); kOther
// for the tables that are looked up rather than multiplied, vectors and biases.
OpKind product_kind(const Param& p, bool tied) {
  const std::string& name = p.name;
  if (p.shape.size() < 2) return OpKind::kOther;
  // An MTP module's eh_proj runs in its head's time.
  if (name == "lm_head.weight" || (tied && name == "model.embed_tokens.weight") ||
      name.find(".eh_proj.") != std::string::npos)
    return OpKind::kHead;
  if (p.spec.expert) return OpKind::kExperts;
  if (name.find(".self_attn.") != std::string::npos) return OpKind::kAttention;
  if (name.find(".mlp.gate.weight") != std::string::npos) return OpKind::kRouter;
  if (name.find(".mlp.shared_expert") != std::string::npos) return OpKind::kSharedExperts;
  if (name.find(".mlp.") != std::string::npos) return OpKind::kDenseFfn;
  return OpKind::kOther;
}

}  // namespace

ModelStats compute_model_stats(const config::Recipe& recipe) {
  ParamStore params;
  Transformer model(recipe, params);  // registers shapes only; nothing is allocated
  ModelStats s;
  int64_t embed_table = 0;
  for (const Param& p : params.params()) {
    const int64_t n = shape_numel(p.shape);
    s.total_params += n;
    if (p.spec.expert) s.expert_params += n;
    if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight") s.embedding_params += n;
    if (p.name == "model.embed_tokens.weight") embed_table = n;
  }
  const auto& moe = recipe.moe();
  const double active_experts =
      moe.num_experts() > 0 ? static_cast<double>(s.expert_params) * moe.top_k() / moe.num_experts()
                            : 0.0;
  s.active_params = s.total_params - s.expert_params + static_cast<int64_t>(active_experts);
  // The embedding lookup is a gather; with tied weights the same table is the LM head GEMM.
  const auto& m = recipe.model();
  // Each MTP module multiplies by the shared LM head once more.
  const int64_t head_again = int64_t{m.mtp_depth()} * m.vocab_size() * m.hidden_size();
  const int64_t gemm_params =
      s.active_params - (m.tie_embeddings() ? 0 : embed_table) + head_again;
  // Scores over the query/key width, then the weighted sum over the value width.
  const bool latent = m.mla().kv_lora_rank() > 0;
  const double qk = latent ? m.mla().qk_nope_head_dim() + m.mla().qk_rope_head_dim() : m.head_dim();
  const double v = latent ? m.mla().v_head_dim() : m.head_dim();
  const double attention = 2.0 * (m.num_layers() + m.mtp_depth()) * recipe.train().seq_len() *
                           static_cast<double>(m.num_heads()) * (qk + v);
  s.forward_flops_per_token = 2.0 * gemm_params + attention;
  const double expert_share =
      moe.num_experts() > 0 ? static_cast<double>(moe.top_k()) / moe.num_experts() : 0.0;
  for (const Param& p : params.params()) {
    const OpKind kind = product_kind(p, m.tie_embeddings());
    if (kind == OpKind::kOther) continue;
    const double weights = static_cast<double>(shape_numel(p.shape));
    s.forward_flops_by_kind[static_cast<int>(kind)] +=
        2.0 * weights * (kind == OpKind::kExperts ? expert_share : 1.0);
  }
  s.forward_flops_by_kind[static_cast<int>(OpKind::kHead)] += 2.0 * static_cast<double>(head_again);
  s.forward_flops_by_kind[static_cast<int>(OpKind::kAttentionCore)] = attention;
  s.train_flops_per_token = 3.0 * s.forward_flops_per_token;
  return s;
}

}  // namespace switchyard
