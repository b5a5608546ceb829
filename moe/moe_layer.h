// One MoE FFN layer: the router (logits, gating, routing losses; moe/router.h) -> the
// token dispatcher (capacity, permute, all-to-all over the expert-parallel group;
// moe/token_dispatcher.h) -> grouped SwiGLU experts -> the dispatcher's combine, plus
// optional shared experts.
//
// With an expert-parallel group of P ranks, rank p holds the experts at positions
// [p * E/P, (p+1) * E/P) of the parameter store's expert order (parallel.expert_placement;
// the experts in order by default; the expert parameters are that shard) and routes its
// own tokens over all E experts, by their logical ids.
//
// With a tensor-parallel group of T ranks (parallel folding, DESIGN.md), the T ranks
// hold the same n tokens; rank r routes rows [r n / T, (r + 1) n / T) and the routed
// outputs are all-gathered back over the group. Routing statistics, the aux and z
// losses and the capacity decisions are taken over all n tokens, exactly as one rank
// would; the shared experts run on all n tokens, split Megatron-style over the group.
//
// Padded windows (data.packing PAD): each sequence's first real-token rows hold text and
// the rest padding, which routes nowhere: a pad row is sent to no expert (expert id -1,
// routed output zero), takes no capacity (capacity is over the real tokens), adds nothing
// to the routing sums, and its router logits get no gradient.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"
#include "moe/router.h"
#include "moe/router_stats.h"
#include "moe/swiglu_ffn.h"
#include "moe/token_dispatcher.h"

namespace switchyard {

class MoeLayer {
 public:
  // `expert_parallel` and `tensor_parallel` may be null (one rank).
  MoeLayer(ParamStore& params, const std::string& prefix, const config::ModelConfig& model,
           const config::MoeConfig& moe, Communicator* expert_parallel,
           Communicator* tensor_parallel = nullptr);

  // x: (n, hidden) -> (n, hidden), the n tokens being `seq_len`-token sequences. Adds
  // this layer's routing to `stats` (a row of its device sums, RouterStats::add_layer,
  // and with moe.seq_aux_loss_coef each sequence's sums, add_sequence_sums). `rng` drives
  // GShard's random second-expert dispatch during training. Nothing waits for the host,
  // except that expert parallelism reads the exchanged expert counts back (they size the
  // all-to-all), a capacity under tensor parallelism reads the group's plan back, and f32
  // products on CUDA read the counts back once (group_sizes_for).
  // `real_tokens`: empty (every row is a token), or one entry per sequence, its rows
  // holding text (at most seq_len; the rest are padding).
  Tensor forward(Device& dev, const Tensor& x, bool training, Rng& rng, RouterStats& stats,
                 int64_t seq_len, std::span<const int32_t> real_tokens = {});
  // The inference forward (generation): every token goes to all of its top-k experts,
  // with no capacity and no GShard drop, as transformers routes.
  Tensor infer(Device& dev, const Tensor& x, RouterStats& stats);
  // dy: (n, hidden) -> dx. `aux_prob_grad` (E) is the gradient of the weighted aux loss
  // with respect to each token's router probabilities, `z_loss_scale` and
  // `seq_aux_loss_scale` the weights of this layer's z-loss and sequence-wise aux loss in
  // the total loss.
  Tensor backward(Device& dev, const Tensor& dy, const Tensor& aux_prob_grad, float z_loss_scale,
                  float seq_aux_loss_scale = 0);
  // Selective recomputation: forward keeps the experts' permuted input rows but not their
  // gate/up and activation outputs; backward computes those again from the rows.
  void set_recompute_experts(bool recompute) { recompute_experts_ = recompute; }
  // Drops everything forward saved for backward (its routing included).
  void discard();
  // The same but the routing last_routing() reads: what a forward-only pass keeps.
  void discard_keeping_routing();
  // Everything the layer itself saved for backward (its router, dispatcher and shared
  // experts keep theirs), its one record of it.
  struct Saved {
    Tensor x_whole;            // (n * tp, hidden) the group's tokens
    Tensor x;                  // (n, hidden) the rows this rank routes
    Tensor xp;                 // (rows, hidden) tokens in local-expert order
    Tensor gate_up_out;        // (rows, 2 * ffn)
    Tensor act;                // (rows, ffn)
    Tensor shared_out;         // (n, hidden)
    Tensor shared_gate_logit;  // (n, 1)
  };
  // The records of the layer and its modules, moved out of the layer (left as after
  // discard()) and back, so that several micro-batches can wait for their backward
  // (pipeline schedules).
  struct Stash {
    Saved own;
    Router::Saved router;
    TokenDispatcher::Saved dispatcher;
    SwigluFfn::Saved shared;
  };
  Stash stash();
  void restore(Stash&& stash);

  int num_experts() const { return num_experts_; }
  int top_k() const { return top_k_; }
  // The sigmoid router's per-expert selection bias (E) f32, a parameter that no gradient
  // trains (loss-free balancing moves it, ExpertBiasBalancer); null for other gatings.
  Param* expert_bias() const { return router_.expert_bias(); }
  // The routing of the last forward (this rank's tokens), for load-balance analysis
  // (`bench balance`): the layer's saved tensors, or with padded windows a host copy of
  // the rows holding text, one after another (padding is routed nowhere, so it is left
  // out).
  MoeRouting last_routing() const { return router_.last_routing(); }

 private:
  // forward() and infer(): the routed and shared experts at this capacity factor;
  // seq_len 0: no sequence-wise aux loss.
  Tensor run(Device& dev, const Tensor& x, bool training, Rng& rng, RouterStats& stats,
             float capacity_factor, int64_t seq_len, PaddedWindows padding);
  // Runs the local experts on the saved xp, rows grouped by local expert (the
  // dispatcher's local_counts()).
  Tensor experts_forward(Device& dev);
  // The experts' gate/up and activation outputs of xp into gate_up_out and act.
  void experts_hidden(Device& dev);
  // The experts' weight gradients from the gradients of their outputs and of their
  // gate/up products (engine/optim/exact_grads.h: one part per source rank).
  void expert_weight_grads(Device& dev, const Tensor& dout, const Tensor& dgate_up);
  // The shared experts on the group's tokens x, added to the routed output y; and their
  // backward, added to dx.
  void shared_forward(Device& dev, const Tensor& x, Tensor& y);
  void shared_backward(Device& dev, const Tensor& dy, Tensor& dx);

  int num_experts_;
  int num_local_experts_;
  Communicator* ep_;  // null or of size 1: no exchange
  Communicator* tp_;  // null or of size 1: every token routed here
  int top_k_;
  bool sequence_aux_;  // moe.seq_aux_loss_coef > 0
  float capacity_factor_;
  bool recompute_experts_ = false;
  Router router_;  // first: its parameters come first in the layer's
  Param* gate_up_;  // (E, 2 * ffn, hidden), gate rows first
  Param* down_;     // (E, hidden, ffn)
  std::unique_ptr<SwigluFfn> shared_;
  Param* shared_gate_ = nullptr;  // (1, hidden)
  TokenDispatcher dispatcher_;
  Saved saved_;
};

}  // namespace switchyard
