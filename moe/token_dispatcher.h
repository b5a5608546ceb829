// The token dispatcher of one MoE layer: it plans where each of this rank's assignments
// goes (the dispatch plan, capacity included), gathers their rows grouped by expert, sends
// them over the expert-parallel group to the ranks owning their experts (regrouped there
// by local expert for the grouped products), and brings the experts' outputs back to be
// combined into token order. It owns the plan and its buffers for the backward pass.
//
// With an expert-parallel group of P ranks, rank p holds the experts at positions
// [p * E/P, (p+1) * E/P) of the expert order (parallel.expert_placement; by default the
// experts in order), its local expert i the one at position p * E/P + i. The router's
// expert ids stay logical: the plan groups rows by position, and tokens_per_expert() is
// by logical expert.
// With a tensor-parallel group, each rank dispatches its own share of the group's tokens;
// a capacity then keeps each expert's highest-weight assignments over the whole group.
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"

namespace switchyard {

class TokenDispatcher {
 public:
  // `expert_parallel`, `tensor_parallel`: null or of size 1 for no exchange. `slots`:
  // assignment slots per token (top-k, or E for expert choice). `expert_order`: the
  // experts by position (empty: in order).
  TokenDispatcher(int num_experts, int num_local_experts, int slots, int top_k,
                  Communicator* expert_parallel, Communicator* tensor_parallel,
                  const std::vector<int>& expert_order = {});

  // The dispatch plan of this rank's assignments (ids: (n, slots), -1 not sent) at
  // `capacity_factor` over the group's `total_tokens` routed tokens (its rows less any
  // padding, which has ids -1; <= 0: dropless). On one tensor-parallel rank every
  // assignment keeps a row, n * slots, whatever capacity and
  // GShard drop (the kept ones come first, grouped by expert, and the grouped products
  // skip the rest), so nothing waits for the host. A capacity over a tensor-parallel
  // group plans the whole group's assignments and keeps only this rank's kept rows.
  void plan(Device& dev, const Tensor& ids, const Tensor& weights, int64_t total_tokens,
            float capacity_factor);
  // Kept assignments per (logical) expert (E) i32 on the device, for this rank's tokens.
  const Tensor& tokens_per_expert() const {
    return position_.empty() ? saved_.tokens_per_expert : saved_.logical_tokens_per_expert;
  }
  // The planned rows of x (n, hidden), grouped by the local expert that takes them
  // (rows per local expert: local_counts()).
  Tensor dispatch(Device& dev, const Tensor& x);
  const Tensor& local_counts() const { return saved_.local_counts; }
  // Under expert parallelism, the rows each source rank sent each local expert:
  // [source * local experts + expert]. Within an expert's rows, the sources come in order.
  const std::vector<int64_t>& received_by_source() const { return saved_.received_by_source; }
  // The local experts' outputs back in token order, each token's the sum of its kept
  // assignments' rows times `weights` (n, slots).
  Tensor combine(Device& dev, const Tensor& local_out, const Tensor& weights);
  // Backward of combine: the gradient of the local experts' outputs, and `dweights`
  // (n, slots) f32 written.
  Tensor combine_backward(Device& dev, const Tensor& dy, const Tensor& weights, Tensor& dweights);
  // Backward of dispatch: adds the rows' gradients (by local expert) into dx (n, hidden).
  void dispatch_backward(Device& dev, const Tensor& dlocal_rows, Tensor& dx);
  // Drops the plan and the saved rows.
  void discard();
  // The plan and the saved rows, the dispatcher's one record of them.
  struct Saved {
    Tensor tokens_per_expert;          // (E) i32 on the device, by position
    Tensor logical_tokens_per_expert;  // (E) i32 on the device, by expert (a placement only)
    Tensor dest_rows;  // (n, slots) i32: each assignment's permuted row, -1 dropped
    int64_t permuted_rows = 0;
    // Exchange plan (expert parallelism): rows sent to / received from each rank, the
    // received rows' places in local-expert order, and the rows per local expert.
    std::vector<int64_t> send_rows, recv_rows, received_by_source;
    Tensor regroup_rows;  // (received, 1) i32
    Tensor local_counts;  // (local experts) i32, where the grouped products want them
    Tensor expert_out;    // (permuted rows, hidden) the experts' outputs in permuted order
  };
  // The record moved out (leaving the dispatcher as after discard()) and back: one
  // micro-batch's, while others run (pipeline schedules).
  Saved stash();
  void restore(Saved&& saved);

 private:
  // Expert parallelism: the forward exchange of permuted rows (grouped by global expert)
  // to the ranks owning their experts, regrouped there by local expert; and the way back.
  Tensor exchange(Device& dev, const Tensor& rows);
  Tensor return_rows(Device& dev, const Tensor& expert_rows);
  // plan() for ids by position.
  void plan_positions(Device& dev, const Tensor& ids, const Tensor& weights, int64_t total_tokens,
                      float capacity_factor);
  // Under an expert placement: the ids by position, and the kept counts back by expert.
  Tensor positions_of(Device& dev, const Tensor& ids) const;
  void count_by_expert(Device& dev);

  int num_experts_;
  int num_local_experts_;
  int slots_;
  int top_k_;
  Communicator* ep_;  // null or of size 1: no exchange
  Communicator* tp_;  // null or of size 1: every token dispatched here
  // position_[e]: expert e's position in the expert order; empty when in order.
  std::vector<int32_t> position_;

  Saved saved_;
};

}  // namespace switchyard
