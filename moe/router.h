// The router of one MoE layer: its logits (the tokens times the router weight, in f32),
// the gating (scores, the choice of experts and their weights), the routing sums behind
// the aux, z and sequence-wise aux losses, and in backward the gradients of those losses
// and of the weights into the router weight and the tokens. The token dispatcher
// (moe/token_dispatcher.h) then moves the chosen tokens to the experts.
//
// The gatings differ in their two passes alone, paired in one table (Router::Gate).
//
// With a tensor-parallel group, each rank routes its share of the group's tokens (rows
// from group token first_token); the routing sums are then summed over the group, and the
// router weight's gradient too.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"
#include "kernels/sequence_aux.h"
#include "kernels/top_k_selection.h"
#include "moe/router_stats.h"

namespace switchyard {

// One forward's routing of its n tokens: router logits and softmax probabilities (sigmoid
// scores with moe.score_function SIGMOID) (n, E) f32, the chosen expert ids (n, slots) i32
// and their weights (n, slots) f32.
struct MoeRouting {
  Tensor logits;
  Tensor probs;
  Tensor expert_ids;
  Tensor weights;
};

// Padded windows (data.packing PAD): each window of `window` rows holds text in its
// first real_tokens rows and padding in the rest. Empty: every row is a token.
struct PaddedWindows {
  std::vector<int32_t> real_tokens;
  int64_t window = 0;

  // The windows of `seq_len` rows with these real tokens (one per window, or none), or
  // no padding when every window is full.
  static PaddedWindows of(std::span<const int32_t> real_tokens, int64_t seq_len);
  bool empty() const { return real_tokens.empty(); }
  // The tokens among the group's `total` rows: the real ones.
  int64_t tokens(int64_t total) const;
  // The [begin, end) ranges of the rows from group token `first_token`, n of them, that
  // hold text (`real` true) or padding.
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t first_token, int64_t n,
                                                  bool real) const;
  // Sends the padding rows of `ids` (rows from group token `first_token`, slots) to no
  // expert (-1).
  void unroute(int64_t first_token, Tensor& ids) const;
};

class Router {
 public:
  // Registers the router weight `prefix`gate.weight (E, hidden) and, for the sigmoid
  // score function, its selection bias. `tensor_parallel` may be null (one rank).
  Router(ParamStore& params, const std::string& prefix, const config::MoeConfig& moe,
         int64_t hidden, float init_std, Communicator* tensor_parallel);

  // Assignment slots per token: top_k, or for expert choice one per expert (-1 where
  // the expert did not take the token).
  int slots() const { return slots_; }
  // Expert choice takes its capacity in its choice: the dispatch drops nothing more.
  bool chooses_by_expert() const { return expert_choice_; }
  // The sigmoid router's per-expert selection bias (E) f32, a parameter that no gradient
  // trains (loss-free balancing moves it, ExpertBiasBalancer); null otherwise.
  Param* expert_bias() const { return bias_; }

  // Routes x (n, hidden), this rank's rows of the group's tokens (those from group token
  // `first_token`) in the windows `padding`, and writes the routing sums (2E + 1) of its
  // real tokens to `sums`. With seq_len > 0 (the sequence-wise aux loss) also adds the
  // group's sequence sums to `stats`, summed over the group. `capacity_factor`: expert
  // choice's.
  void forward(Device& dev, const Tensor& x, int64_t first_token, PaddedWindows padding,
               float capacity_factor, int64_t seq_len, RouterStats& stats, Tensor& sums);
  const Tensor& weights() const { return saved_.routing.weights; }
  const PaddedWindows& padding() const { return saved_.padding; }
  // The expert ids to dispatch (n, slots): the choice, less padding (-1) and, training
  // with GShard, each token's second expert where it lost its draw from `rng` (token t of
  // the group draws the t-th number; rng then moves past the group's `total` tokens).
  Tensor dispatch_ids(Device& dev, bool training, Rng& rng, int64_t total) const;
  // Backward: dweights (n, slots), the gradient of the weights -> the router weight's
  // gradient (accumulated) and the tokens', added to dx (n, hidden). `aux_prob_grad` (E)
  // is the gradient of the weighted aux loss with respect to each token's scores,
  // `z_loss_scale` and `seq_aux_loss_scale` the weights of the z-loss and sequence-wise
  // aux loss in the total loss; `total` the group's rows.
  void backward(Device& dev, const Tensor& dweights, const Tensor& aux_prob_grad,
                float z_loss_scale, float seq_aux_loss_scale, int64_t total, Tensor& dx);
  // The last forward's routing, of this rank's rows: the saved tensors, or with padding a
  // host copy of the rows holding text, one after another.
  MoeRouting last_routing() const;

  // Everything forward saved for backward, the router's one record of it.
  struct Saved {
    MoeRouting routing{};     // what last_routing() reads
    PaddedWindows padding{};  // the forward's windows
    Tensor x{};               // (n, hidden) f32, the router's input
    int64_t first_token = 0;  // the group token of its first row
    Tensor sequence_sums{};   // (sequences, 2E) the group's, with the sequence-wise aux loss
    SequenceRows sequence_rows{};  // where this rank's rows lie in those sequences
  };
  void discard() { saved_ = {}; }
  // Keeps what last_routing() reads: what a forward-only pass keeps.
  void discard_keeping_routing() {
    saved_ = {.routing = std::move(saved_.routing), .padding = std::move(saved_.padding)};
  }
  // The record moved out (leaving the router as after discard()) and back.
  Saved stash() { return std::exchange(saved_, {}); }
  void restore(Saved&& saved) { saved_ = std::move(saved); }

 private:
  struct Gate;
  static const Gate& gate_for(const config::MoeConfig& moe);
  // The gating of the logits of `routing` over all of its rows.
  void gate_rows(Device& dev, float capacity_factor, MoeRouting& routing, Tensor& sums) const;
  // Padded windows: the gating of the real rows alone, as a batch of their own (expert
  // choice chooses among them, the capacity over them); padding rows are chosen by none.
  void gate_real_rows(Device& dev, float capacity_factor, Tensor& sums);
  // The routing sums (2E + 1) and, when defined, the sequence sums over the real rows.
  void real_routing_sums(Device& dev, Tensor& sums);
  // backward(): the sequence-wise aux loss's gradient into dlogits.
  void sequence_aux_grad(Device& dev, float seq_aux_loss_scale, Tensor& dlogits) const;
  // backward(): dlogits -> the router weight's gradient and the tokens', added to dx.
  void weight_and_input_grads(Device& dev, const Tensor& dlogits, Tensor& dx);

  int num_experts_;
  int top_k_;
  int slots_;
  const Gate& gate_;
  SigmoidGating gating_;  // k and renormalisation; the sigmoid's scaling and groups
  bool expert_choice_;
  bool gshard_;
  bool force_balance_;
  Communicator* tp_;  // null or of size 1
  Param* weight_;     // (E, hidden)
  Param* bias_ = nullptr;
  Saved saved_;
};

}  // namespace switchyard
