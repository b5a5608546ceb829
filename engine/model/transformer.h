// The decoder-only MoE language model: embedding, decoder blocks (attention + dense or
// MoE FFN, pre-norm residual), final norm, LM head and loss. forward() saves
// activations inside the modules; backward() consumes them and accumulates parameter
// gradients into the ParamStore.
#pragma once

#include <memory>
#include <vector>

#include "engine/config/recipe.pb.h"
#include "engine/model/attention.h"
#include "engine/runtime/param_store.h"
#include "engine/runtime/rng.h"
#include "engine/runtime/tensor.h"
#include "moe/moe_layer.h"
#include "moe/router_stats.h"
#include "moe/swiglu_ffn.h"

namespace switchyard {

struct LossParts {
  double cross_entropy = 0;  // mean over target tokens
  double aux_loss = 0;       // unweighted load-balancing loss
  double z_loss = 0;         // unweighted router z-loss (sum over MoE layers)
  double total = 0;          // cross_entropy + aux_coef * aux_loss + z_coef * z_loss
  int64_t target_tokens = 0;
};

class Transformer {
 public:
  // Registers every parameter in `params` (allocation is the caller's). With an
  // expert-parallel group of more than one rank, the MoE layers hold and run this
  // rank's shard of the experts.
  Transformer(const config::Recipe& recipe, ParamStore& params,
              Communicator* expert_parallel = nullptr);
  ~Transformer();

  // ids, targets: (batch, seq) i32; a negative target is not scored. Returns the losses;
  // when `logits_out` is given it receives the (batch * seq, vocab) logits.
  LossParts forward(Device& dev, const Tensor& ids, const Tensor& targets, bool training,
                    Rng& rng, Tensor* logits_out = nullptr);
  // Backward of forward()'s total loss multiplied by `loss_scale` (e.g. 1 / micro-batches).
  void backward(Device& dev, float loss_scale);

  // Logits only, for sampling and evaluation: ids (batch, seq) -> (batch * seq, vocab).
  Tensor logits(Device& dev, const Tensor& ids);

  const RouterStats& router_stats() const { return stats_; }
  bool has_moe() const { return num_moe_layers_ > 0; }
  // The MoE layers in depth order; their last_routing() describes the last forward.
  std::vector<const MoeLayer*> moe_layers() const;

 private:
  struct Block;
  const Tensor& rope_for(int64_t seq);

  config::Recipe recipe_;
  Param* embed_;
  Param* final_norm_;
  Param* lm_head_;  // aliases embed_ when tied
  std::vector<std::unique_ptr<Block>> blocks_;
  int num_moe_layers_ = 0;
  Tensor rope_;
  int64_t rope_seq_ = 0;
  RouterStats stats_;

  // Saved for backward.
  int64_t batch_ = 0, seq_ = 0;
  Tensor ids_, targets_;
  Tensor final_in_, final_rstd_, final_out_;
  Tensor logits_, lse_;
  int64_t target_tokens_ = 0;
};

}  // namespace switchyard
