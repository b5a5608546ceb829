// Parameter and FLOP counts of a recipe's model, derived from the parameters the model
// actually registers (so the numbers cannot drift from the code).
#pragma once

#include <cstdint>

#include "core/config/recipe.pb.h"
#include "core/runtime/op_clock.h"

namespace switchyard {

struct ModelStats {
  int64_t total_params = 0;
  int64_t expert_params = 0;       // routed-expert weights (all experts)
  int64_t embedding_params = 0;    // input embedding table (plus the LM head when separate)
  int64_t active_params = 0;       // per token: everything but the unselected experts
  // Matrix-multiply FLOPs per token at train.seq_len: 2 x active weights used in GEMMs
  // (the LM head, not the embedding lookup) plus causal-attention score and value
  // products, 4 x layers x seq_len x heads x head_dim (the PaLM convention, counting the
  // full square). Training is three times the forward.
  double forward_flops_per_token = 0;
  double train_flops_per_token = 0;
  // forward_flops_per_token by the kind of work that does it (train --op-times): each
  // matrix's 2 x weights to its kind, the attention products to the attention core.
  OpFlops forward_flops_by_kind{};
};

ModelStats compute_model_stats(const config::Recipe& recipe);

}  // namespace switchyard
