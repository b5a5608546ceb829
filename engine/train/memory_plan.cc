#include "engine/train/memory_plan.h"

#include <map>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/zero.h"
#include "engine/parallel/communicator.h"
#include "engine/runtime/check.h"

namespace switchyard {

namespace {

// "76.20 GiB", or "13.8 MiB" below a GiB.
std::string size_text(double bytes) {
  constexpr double kMiB = 1 << 20;
  constexpr double kGiB = 1 << 30;
  return bytes >= kGiB ? absl::StrFormat("%.2f GiB", bytes / kGiB)
                       : absl::StrFormat("%.1f MiB", bytes / kMiB);
}

// A rank's place in a group, for registering its shards: the model's constructor reads
// only the rank and the size, and a plan never communicates.
class PlacementOnly final : public Communicator {
 public:
  PlacementOnly(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { fail(); }

 protected:
  void all_reduce_sum_f32(float*, int64_t) override { fail(); }
  void all_reduce_sum_f64(double*, int64_t) override { fail(); }
  void all_reduce_sum_i64(int64_t*, int64_t) override { fail(); }
  void reduce_scatter_sum_f32(const float*, float*, int64_t) override { fail(); }
  void all_gather_impl(const Tensor&, Tensor&) override { fail(); }
  void all_to_all_v_impl(const Tensor&, const std::vector<int64_t>&, Tensor&,
                         const std::vector<int64_t>&) override {
    fail();
  }
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>&) override {
    fail();
    return {};
  }
  void broadcast_impl(Tensor&, int) override { fail(); }

 private:
  [[noreturn]] static void fail() { SY_CHECK_MSG(false, "a memory plan never communicates"); }
  int rank_;
  int size_;
};

// What the rank at (tp_index, ep_index) of `layout` needs, registering its shards.
RankMemory placement_memory(const config::Recipe& recipe, const Layout& layout, int tp_index,
                            int ep_index, DType working) {
  PlacementOnly tp(tp_index, layout.tensor_parallel_size);
  PlacementOnly ep(ep_index, layout.expert_parallel_size);
  ParamStore params(ShardPlacement{tp_index, layout.tensor_parallel_size, ep_index,
                                   layout.expert_parallel_size});
  const Transformer model(recipe, params, {&tp, &ep});
  const int zero_stage = recipe.parallel().zero_stage();
  if (zero_stage >= 2)
    for (Param& p : params.params()) mark_zero_residency(p, zero_stage);
  return rank_memory_lower_bound(recipe, params, working, layout.data_parallel_size);
}

}  // namespace

RankMemory rank_memory_lower_bound(const config::Recipe& recipe, const ParamStore& params,
                                   DType working, int dp_size) {
  const config::TrainConfig& tc = recipe.train();
  RankMemory m;
  m.weights_and_gradients = static_cast<double>(params.allocation_bytes(working));
  m.optimizer_state = static_cast<double>(
      optimizer_bytes_lower_bound(params, recipe.parallel().zero_stage(), dp_size));
  m.layer_inputs = 4.0 * static_cast<double>(tc.micro_batch_size()) *
                   static_cast<double>(tc.seq_len()) *
                   static_cast<double>(recipe.model().hidden_size()) *
                   recipe.model().num_layers();
  return m;
}

std::vector<RankMemory> plan_rank_memory(const config::Recipe& recipe, const Layout& layout,
                                         DType working) {
  std::map<std::pair<int, int>, RankMemory> by_placement;
  std::vector<RankMemory> ranks;
  for (int rank = 0; rank < layout.world_size; ++rank) {
    const std::pair<int, int> placement{layout.tp_index(rank), layout.ep_index(rank)};
    auto it = by_placement.find(placement);
    if (it == by_placement.end())
      it = by_placement
               .emplace(placement, placement_memory(recipe, layout, placement.first,
                                                    placement.second, working))
               .first;
    RankMemory m = it->second;
    m.rank = rank;
    m.tp_index = placement.first;
    m.ep_index = placement.second;
    ranks.push_back(m);
  }
  return ranks;
}

std::string describe_rank_memory(const RankMemory& m) {
  return absl::StrFormat(
      "rank %d (tp %d, ep %d): at least %s: weights and gradients %s, optimizer state %s, "
      "layer inputs %s",
      m.rank, m.tp_index, m.ep_index, size_text(m.total()), size_text(m.weights_and_gradients),
      size_text(m.optimizer_state), size_text(m.layer_inputs));
}

std::string tight_fit_warning(const std::string& device, double bytes, double available) {
  if (available <= 0 || bytes > available || bytes < 0.9 * available) return "";
  return absl::StrFormat(
      "warning: this run needs at least %s on %s before its first step, %.0f%% of the %s "
      "available there; the activations beyond the layer inputs may not fit (use a smaller "
      "micro-batch, or more ranks)",
      size_text(bytes), device, 100.0 * bytes / available, size_text(available));
}

}  // namespace switchyard
