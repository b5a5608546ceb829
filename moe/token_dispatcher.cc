#include "moe/token_dispatcher.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/runtime/check.h"
#include "core/runtime/op_clock.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "moe/capacity.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}

int64_t total(const std::vector<int64_t>& rows) {
  return std::accumulate(rows.begin(), rows.end(), int64_t{0});
}
}  // namespace

TokenDispatcher::TokenDispatcher(int num_experts, int num_local_experts, int slots, int top_k,
                                 Communicator* expert_parallel, Communicator* tensor_parallel,
                                 const std::vector<int>& expert_order)
    : num_experts_(num_experts),
      num_local_experts_(num_local_experts),
      slots_(slots),
      top_k_(top_k),
      ep_(expert_parallel && expert_parallel->size() > 1 ? expert_parallel : nullptr),
      tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr) {
  SY_CHECK_MSG(expert_order.empty() || static_cast<int>(expert_order.size()) == num_experts,
               "the expert order does not list every expert");
  std::vector<int32_t> position(expert_order.size(), -1);
  bool in_order = true;
  for (size_t i = 0; i < expert_order.size(); ++i) {
    const int e = expert_order[i];
    SY_CHECK_MSG(e >= 0 && e < num_experts && position[static_cast<size_t>(e)] < 0,
                 "the expert order is not a permutation of the experts");
    position[static_cast<size_t>(e)] = static_cast<int32_t>(i);
    in_order = in_order && e == static_cast<int>(i);
  }
  if (!in_order) position_ = std::move(position);
}

void TokenDispatcher::plan(Device& dev, const Tensor& expert_ids, const Tensor& weights,
                           int64_t total_tokens, float capacity_factor) {
  const OpScope scope(OpKind::kDispatch, OpPass::kForward, dev);
  const Tensor ids = position_.empty() ? expert_ids : positions_of(dev, expert_ids);
  plan_positions(dev, ids, weights, total_tokens, capacity_factor);
  if (!position_.empty()) count_by_expert(dev);
}

// The relabelling runs on the host: with expert parallelism the exchange waits for the
// counts there anyway.
Tensor TokenDispatcher::positions_of(Device& dev, const Tensor& ids) const {
  Tensor placed = Tensor::empty(ids.shape(), DType::kI32);
  placed.copy_from(ids);  // the router's ids stay as they are, for the backward
  int32_t* id = placed.data<int32_t>();
  for (int64_t a = 0; a < placed.numel(); ++a)
    if (id[a] >= 0) id[a] = position_[static_cast<size_t>(id[a])];
  return placed.to(dev, MemoryKind::kActivations);
}

void TokenDispatcher::count_by_expert(Device& dev) {
  const Tensor by_position = saved_.tokens_per_expert.on_host();
  Tensor by_expert = Tensor::empty({num_experts_}, DType::kI32);
  const int32_t* from = by_position.data<int32_t>();
  int32_t* to = by_expert.data<int32_t>();
  for (int e = 0; e < num_experts_; ++e) to[e] = from[position_[static_cast<size_t>(e)]];
  saved_.logical_tokens_per_expert = by_expert.to(dev, MemoryKind::kActivations);
}

void TokenDispatcher::plan_positions(Device& dev, const Tensor& ids, const Tensor& weights,
                                     int64_t total_tokens, float capacity_factor) {
  const int E = num_experts_;
  const int64_t n = ids.dim(0);
  saved_.tokens_per_expert = activation(dev, {E}, DType::kI32);
  saved_.dest_rows = activation(dev, {n, slots_}, DType::kI32);
  const int64_t capacity =
      capacity_factor > 0 ? expert_capacity(capacity_factor, total_tokens, top_k_, E) : -1;
  if (!tp_ || capacity < 0) {
    permute_plan(dev, ids, weights, E, capacity, saved_.tokens_per_expert, saved_.dest_rows);
    saved_.permuted_rows = n * slots_;
    return;
  }
  // Capacity keeps each expert's highest-weight assignments among all the group's
  // tokens: every rank plans the whole group's assignments (a few bytes per token) and
  // then sends only its own kept ones.
  const int64_t group_rows = n * tp_->size();
  Tensor all_ids = activation(dev, {group_rows, slots_}, DType::kI32);
  Tensor all_weights = activation(dev, {group_rows, slots_});
  tp_->all_gather(ids, all_ids);
  tp_->all_gather(weights, all_weights);
  Tensor all_per_expert = activation(dev, {E}, DType::kI32);
  Tensor all_dest = activation(dev, {group_rows, slots_}, DType::kI32);
  permute_plan(dev, all_ids, all_weights, E, capacity, all_per_expert, all_dest);
  Tensor kept_ids = activation(cpu_device(), {n, slots_}, DType::kI32);
  kept_ids.copy_from(ids);
  const Tensor mine = all_dest.slice_rows(tp_->rank() * n, (tp_->rank() + 1) * n).on_host();
  int32_t* kept = kept_ids.data<int32_t>();
  const int32_t* dest = mine.data<int32_t>();
  int64_t rows = 0;
  for (int64_t a = 0; a < n * slots_; ++a) {
    if (dest[a] < 0) kept[a] = -1;
    rows += kept[a] >= 0;
  }
  permute_plan(dev, kept_ids.to(dev, MemoryKind::kActivations), weights, E, -1,
               saved_.tokens_per_expert, saved_.dest_rows);
  saved_.permuted_rows = rows;
}

Tensor TokenDispatcher::dispatch(Device& dev, const Tensor& x) {
  const OpScope scope(OpKind::kDispatch, OpPass::kForward, dev);
  Tensor permuted = activation(dev, {saved_.permuted_rows, x.row_size()}, x.dtype());
  permute_gather(dev, x, saved_.dest_rows, permuted);
  if (ep_) return exchange(dev, permuted);
  saved_.local_counts = group_sizes_for(dev, x.dtype(), saved_.tokens_per_expert);
  return permuted;
}

Tensor TokenDispatcher::combine(Device& dev, const Tensor& local_out, const Tensor& weights) {
  const OpScope scope(OpKind::kCombine, OpPass::kForward, dev);
  saved_.expert_out = ep_ ? return_rows(dev, local_out) : local_out;
  Tensor y = activation(dev, {saved_.dest_rows.dim(0), local_out.row_size()}, local_out.dtype());
  unpermute_combine(dev, saved_.expert_out, saved_.dest_rows, weights, y);
  return y;
}

Tensor TokenDispatcher::combine_backward(Device& dev, const Tensor& dy, const Tensor& weights,
                                         Tensor& dweights) {
  const OpScope scope(OpKind::kCombine, OpPass::kBackward, dev);
  const int64_t hidden = dy.row_size();
  Tensor dexpert_out = activation(dev, {saved_.expert_out.rows(), hidden}, dy.dtype());
  unpermute_combine_backward(dev, dy, saved_.expert_out, saved_.dest_rows, weights, dexpert_out,
                             dweights);
  if (!ep_) return dexpert_out;
  // Backward of return_rows: the rows' gradients travel the dispatch direction.
  const int64_t rows = saved_.regroup_rows.rows();
  Tensor received = activation(dev, {rows, hidden}, dy.dtype());
  ep_->all_to_all_v(dexpert_out, saved_.send_rows, received, saved_.recv_rows);
  Tensor dlocal_out = activation(dev, {rows, hidden}, dy.dtype());
  permute_gather(dev, received, saved_.regroup_rows, dlocal_out);
  return dlocal_out;
}

void TokenDispatcher::dispatch_backward(Device& dev, const Tensor& dlocal_rows, Tensor& dx) {
  const OpScope scope(OpKind::kDispatch, OpPass::kBackward, dev);
  Tensor dpermuted = dlocal_rows;
  if (ep_) {
    // Backward of exchange: back to source order, then to the routing ranks.
    Tensor by_source =
        Tensor::zeros(dlocal_rows.shape(), dlocal_rows.dtype(), MemoryKind::kActivations, dev);
    permute_gather_backward(dev, dlocal_rows, saved_.regroup_rows, by_source);
    dpermuted = activation(dev, {saved_.expert_out.rows(), dlocal_rows.row_size()},
                           dlocal_rows.dtype());
    ep_->all_to_all_v(by_source, saved_.recv_rows, dpermuted, saved_.send_rows);
  }
  permute_gather_backward(dev, dpermuted, saved_.dest_rows, dx);
}

void TokenDispatcher::discard() { saved_ = {}; }

TokenDispatcher::Saved TokenDispatcher::stash() { return std::exchange(saved_, {}); }

void TokenDispatcher::restore(Saved&& saved) { saved_ = std::move(saved); }

Tensor TokenDispatcher::exchange(Device& dev, const Tensor& rows) {
  const int P = ep_->size();
  const int local = num_local_experts_;
  const int E = num_experts_;
  // Rows per (rank, its local expert), sent and then received, in one buffer: the counts
  // travel first, and both come to the host in one copy to size the exchange of rows.
  Tensor both_counts = activation(dev, {2 * E, 1}, DType::kI32);
  Tensor sent_counts = both_counts.slice_rows(0, E);
  Tensor recv_counts = both_counts.slice_rows(E, 2 * E);
  sent_counts.copy_from(saved_.tokens_per_expert.reshape({E, 1}));
  const std::vector<int64_t> per_rank(P, local);
  ep_->all_to_all_v(sent_counts, per_rank, recv_counts, per_rank);
  const Tensor counts_host = both_counts.on_host();
  const int32_t* per_expert = counts_host.data<int32_t>();
  const int32_t* from = per_expert + E;  // from[i * local + e]

  saved_.send_rows.assign(P, 0);
  saved_.recv_rows.assign(P, 0);
  saved_.received_by_source.assign(from, from + E);
  saved_.local_counts = activation(cpu_device(), {local}, DType::kI32);
  int32_t* counts = saved_.local_counts.data<int32_t>();
  std::fill(counts, counts + local, 0);
  for (int j = 0; j < P; ++j)
    for (int e = 0; e < local; ++e) {
      saved_.send_rows[j] += per_expert[j * local + e];
      saved_.recv_rows[j] += from[j * local + e];
      counts[e] += from[j * local + e];
    }
  const int64_t sent_rows = total(saved_.send_rows);
  SY_CHECK_MSG(sent_rows <= rows.rows(),
               "MoE dispatch: the expert counts add up to more than the permuted rows");
  const int64_t received_rows = total(saved_.recv_rows);
  Tensor received = activation(dev, {received_rows, rows.row_size()}, rows.dtype());
  // The kept rows lead the permuted buffer; the rest (dropped assignments) stay here.
  ep_->all_to_all_v(rows.slice_rows(0, sent_rows), saved_.send_rows, received, saved_.recv_rows);

  // Received rows come by source rank, then local expert; the grouped GEMMs want them
  // by local expert, then source rank. Their places come from the received counts, on
  // the device.
  saved_.regroup_rows = activation(dev, {received_rows, 1}, DType::kI32);
  regroup_received_rows(dev, recv_counts.reshape({P, local}), saved_.regroup_rows);
  Tensor grouped = activation(dev, {received_rows, rows.row_size()}, rows.dtype());
  permute_gather(dev, received, saved_.regroup_rows, grouped);
  return grouped;
}

Tensor TokenDispatcher::return_rows(Device& dev, const Tensor& expert_rows) {
  // Back to source order: by_source[r] = expert_rows[saved_.regroup_rows[r]], added to zeros.
  Tensor by_source =
      Tensor::zeros(expert_rows.shape(), expert_rows.dtype(), MemoryKind::kActivations, dev);
  permute_gather_backward(dev, expert_rows, saved_.regroup_rows, by_source);
  Tensor out =
      activation(dev, {total(saved_.send_rows), expert_rows.row_size()}, expert_rows.dtype());
  ep_->all_to_all_v(by_source, saved_.recv_rows, out, saved_.send_rows);
  return out;
}

}  // namespace switchyard
