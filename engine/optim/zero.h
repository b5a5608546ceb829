// ZeRO sharding of the dense parameters over their data-parallel replicas.
//
// Stage 1 gives every parameter an owner among its replicas (assign_owners): the one
// rank that holds its AdamW state, updates it and broadcasts the new value. Expert
// parameters get the same treatment over the expert-data-parallel replicas at every
// stage >= 1.
//
// Stages 2 and 3 (ZeroShards) split every dense parameter by rows instead: replica r
// of P owns rows [r c, (r + 1) c) of it, c = ceil(rows / P), and holds their optimizer
// state and their accumulated gradient. A matrix that Muon trains (engine/optim/muon.h)
// keeps its momentum rows there; its update needs the matrix whole, so the rows of the
// momentum's output are gathered, the parameter's owner (assign_owners) orthogonalises
// it and broadcasts the result, and each replica applies its rows. Through the model's
// ParamHooks, one unit (layer) at a time:
//  - begin_grads: the unit's gradients of this micro-batch accumulate in whole-size
//    buffers; end_grads reduce-scatters them (summed in rank order) onto the owners of
//    the rows, over a communicator of its own: on a background thread where MPI allows,
//    on NCCL's stream without holding back the compute stream. The reduction overlaps
//    the backward of the layer before; the next end_grads (or wait(), before the
//    gradients are read) joins it, adds the rows to the accumulated gradient and frees
//    the whole-size buffers, so at most two units' worth exist at a time.
//  - stage 2 keeps every value whole on every replica and all-gathers the updated rows
//    after each step; stage 3 keeps only the owned rows: acquire all-gathers a unit's
//    values into whole buffers that release frees again.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/work_queue.h"

namespace switchyard {

// The owner of each parameter (registration order) among `dense_replicas` or, for
// expert parameters, `expert_replicas` ranks; -1 where the group has one rank. Each
// parameter goes, in order, to the replica holding the fewest elements of state so far
// (ties: the lowest rank; a frozen parameter holds none), so every rank computes the same
// assignment and the bytes balance.
std::vector<int> assign_owners(const ParamStore& params, int dense_replicas, int expert_replicas);

// What ZeRO stage `stage` (2 or 3) keeps whole on every replica: a dense parameter's
// gradient never (its owned rows live in the shards), its value at stage 2 only;
// expert parameters keep both.
void mark_zero_residency(Param& param, int stage);

class ZeroShards final : public ParamHooks {
 public:
  // This replica's rows of one dense parameter and their state. Rows index dimension 0
  // of the parameter's tensor-parallel shard (Param::shape).
  struct Shard {
    int64_t first_row = 0;
    int64_t rows = 0;      // owned rows (0 where the parameter has fewer rows than P c)
    Tensor value;          // (rows, ...) at stage 3; a view of the whole value at stage 2
    Tensor grad;           // (c, ...) accumulated, padded to the chunk
    Tensor exp_avg, exp_avg_sq;  // (rows, ...); empty where Muon trains the parameter
    Tensor momentum;             // (rows, ...) where Muon trains it, else empty
  };

  // What one step's update takes beyond the shards.
  struct Step {
    double lr = 0;  // the scheduled rate
    int64_t step = 0;
    float grad_scale = 1;
    // Where tensor parallelism splits a Muon matrix, its shards gather whole over it.
    Communicator* tensor_parallel = nullptr;
    // Each parameter's owner among the replicas (assign_owners): who orthogonalises a
    // Muon matrix.
    const std::vector<int>& owners;
  };

  // `stage` 2 or 3; `replicas` the data-parallel group; `reduce_replicas` the same
  // group as a communicator used by nothing else, for the gradient reductions, which
  // run on a thread of their own with `background`; `optimizer` the recipe's. Marks what
  // this rank does not keep resident: construct before params.allocate(), then call
  // initialize().
  ZeroShards(ParamStore& params, Communicator& replicas, int stage, Device& device,
             std::unique_ptr<Communicator> reduce_replicas, bool background,
             const config::OptimizerConfig& optimizer);
  // Allocates the shards and their state; at stage 3 draws the owned rows' initial
  // values (ParamStore::initialize_rows), at stage 2 views the whole values.
  void initialize(uint64_t seed);

  void acquire(int unit) override;
  void release(int unit) override;
  void begin_grads(int unit) override;
  void end_grads(int unit) override;
  // False: end_grads frees a unit's whole gradients unreduced, for a caller that has
  // taken them (ExactGrads), which then fills the shards' gradients itself.
  void set_reduces_gradients(bool reduces) { reduces_ = reduces; }
  // Finishes the gradient reductions posted so far: afterwards the accumulated
  // gradients hold them (for the device work queued after this call).
  void wait() { finish_reductions(); }

  // The shard of registration index `i` (dense parameters only).
  Shard& shard(size_t i) { return shards_[i]; }
  bool is_sharded(size_t i) const { return !params_[i]->spec.expert; }
  // A row-sharded parameter that is trainable: its gradients are reduced onto the rows'
  // owners, which hold its state and update it. A frozen one keeps only its value rows.
  bool is_updated(size_t i) const { return is_sharded(i) && params_[i]->trainable; }
  // Sums of squares of the accumulated gradients over the replicas, exact over rows
  // (row_sum_squares): {replicated over tensor parallelism, split by it} (collective).
  std::array<ExactSum, 2> gradient_squares(Device& dev);
  // AdamW, or Muon, on the owned rows from the accumulated gradients, which are then
  // zeroed; at stage 2 the updated rows are then all-gathered into every replica's whole
  // value (collective).
  void update(Device& dev, const Step& step);
  // Zeroes the accumulated gradients without an update (a skipped step).
  void drop_gradients();
  // Collective over the replicas: the whole value of dense parameter `p` on every rank.
  Tensor whole_value(Param& p);

 private:
  // All-gathers every replica's `mine` (its rows of parameter i, f32) into a whole
  // (padded) buffer of `kind` and returns the first rows, shaped as the parameter.
  Tensor gather_rows(size_t i, const Tensor& mine, MemoryKind kind);
  Tensor gather_value(size_t i) {
    return gather_rows(i, shards_[i].value, MemoryKind::kParameters);
  }
  // A trainable sharded parameter that Muon trains.
  bool is_muon(size_t i) const;
  // Muon's update of every such parameter (collective over the replicas).
  void muon_update(Device& dev, const Step& step);
  // Joins the reductions in flight, adds their rows into the accumulated gradients and
  // frees their buffers.
  void finish_reductions();

  // One parameter's reduction in flight: its whole-size gradient, the rows it brings
  // this replica and the accumulated gradient they go into.
  struct Reduction {
    Tensor whole, mine, grad;
  };

  ParamStore& params_store_;
  std::vector<Param*> params_;              // registration order
  std::vector<std::vector<size_t>> units_;  // each unit's dense parameters
  std::vector<Shard> shards_;               // by registration index
  std::vector<int64_t> chunk_rows_;         // c, by registration index
  Communicator& replicas_;
  int stage_;
  config::OptimizerConfig optimizer_;
  Device& device_;
  std::vector<int> uses_;           // nested acquire() count per unit
  std::vector<bool> grads_open_;    // begin_grads() seen, end_grads() not yet
  std::vector<Tensor> padded_grad_;  // by registration index, while a unit's grads are open
  bool reduces_ = true;
  std::unique_ptr<Communicator> reduce_replicas_;
  std::vector<Reduction> in_flight_;  // the last end_grads' reductions
  WorkQueue reduce_queue_;  // last: its thread ends before the members its work uses
};

}  // namespace switchyard
