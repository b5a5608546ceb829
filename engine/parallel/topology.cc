#include "engine/parallel/topology.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/config/recipe.h"
#include "engine/parallel/local_communicator.h"
#include "engine/parallel/mpi_communicator.h"
#include "engine/parallel/mpi_runtime.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

// `count` ranks starting at `first`, `stride` apart.
std::vector<int> strided_ranks(int first, int count, int stride) {
  std::vector<int> ranks(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) ranks[i] = first + i * stride;
  return ranks;
}

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

}  // namespace

std::vector<int> Layout::tp_group(int rank) const {
  return strided_ranks(dp_index(rank) * tensor_parallel_size, tensor_parallel_size, 1);
}

std::vector<int> Layout::dp_group(int rank) const {
  return strided_ranks(tp_index(rank), data_parallel_size, tensor_parallel_size);
}

std::vector<int> Layout::ep_group(int rank) const {
  return strided_ranks(expert_dp_index(rank) * expert_parallel_size, expert_parallel_size, 1);
}

std::vector<int> Layout::expert_dp_group(int rank) const {
  return strided_ranks(ep_index(rank), expert_data_parallel_size, expert_parallel_size);
}

absl::StatusOr<Layout> make_layout(const config::Recipe& recipe, int world_size) {
  const config::ParallelConfig& parallel = recipe.parallel();
  const config::ModelConfig& model = recipe.model();
  const config::TrainConfig& train = recipe.train();
  if (world_size < 1) return invalid(absl::StrCat("world size (", world_size, ") must be >= 1"));
  const int tp = parallel.tensor_parallel_size() == 0 ? 1 : parallel.tensor_parallel_size();
  const int ep = parallel.expert_parallel_size() == 0 ? 1 : parallel.expert_parallel_size();
  if (tp < 1) return invalid(absl::StrCat("parallel.tensor_parallel_size (", tp, ") must be >= 1"));
  if (ep < 1) return invalid(absl::StrCat("parallel.expert_parallel_size (", ep, ") must be >= 1"));
  if (world_size % tp != 0) {
    return invalid(absl::StrCat("parallel.tensor_parallel_size (", tp,
                                ") must divide the world size (", world_size, ")"));
  }
  if (model.num_heads() % tp != 0) {
    return invalid(absl::StrCat("model.num_heads (", model.num_heads(),
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  }
  const int kv_heads = config::effective_kv_heads(model);
  if (kv_heads % tp != 0) {
    return invalid(absl::StrCat("model.num_kv_heads (", kv_heads,
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  }
  auto divisible_by_tp = [tp](const char* field, int64_t value) -> absl::Status {
    if (value % tp == 0) return absl::OkStatus();
    return invalid(absl::StrCat(field, " (", value,
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  };
  if (tp > 1) {
    SY_RETURN_IF_ERROR(divisible_by_tp("model.vocab_size", model.vocab_size()));
    bool dense_layers = false;
    for (int i = 0; i < model.num_layers(); ++i) dense_layers |= !config::is_moe_layer(recipe, i);
    if (dense_layers)
      SY_RETURN_IF_ERROR(divisible_by_tp("model.ffn_hidden_size", model.ffn_hidden_size()));
    if (recipe.moe().num_shared_experts() > 0)
      SY_RETURN_IF_ERROR(divisible_by_tp(
          "moe.num_shared_experts x moe.shared_expert_ffn_hidden_size",
          recipe.moe().num_shared_experts() * recipe.moe().shared_expert_ffn_hidden_size()));
  }
  if (world_size % ep != 0) {
    return invalid(absl::StrCat("parallel.expert_parallel_size (", ep,
                                ") must divide the world size (", world_size, ")"));
  }
  const int num_experts = recipe.moe().num_experts();
  if (num_experts % ep != 0) {
    return invalid(absl::StrCat("moe.num_experts (", num_experts,
                                ") must be divisible by parallel.expert_parallel_size (", ep, ")"));
  }
  const int dp = world_size / tp;
  const int64_t global_batch = train.global_batch_size();
  const int64_t micro_batch =
      train.micro_batch_size() == 0 ? global_batch : train.micro_batch_size();
  if (global_batch < 1) {
    return invalid(absl::StrCat("train.global_batch_size (", global_batch, ") must be >= 1"));
  }
  if (micro_batch < 1) {
    return invalid(absl::StrCat("train.micro_batch_size (", micro_batch, ") must be >= 1"));
  }
  if (global_batch % (dp * micro_batch) != 0) {
    return invalid(absl::StrCat("train.global_batch_size (", global_batch,
                                ") must be divisible by data-parallel size (", dp,
                                ") x train.micro_batch_size (", micro_batch, ")"));
  }

  if (tp > 1 && (micro_batch * train.seq_len()) % tp != 0) {
    return invalid(absl::StrCat("train.micro_batch_size x train.seq_len (",
                                micro_batch * train.seq_len(),
                                " tokens) must be divisible by parallel.tensor_parallel_size (",
                                tp, "): MoE layers split a micro-batch's tokens over it"));
  }

  Layout layout;
  layout.world_size = world_size;
  layout.tensor_parallel_size = tp;
  layout.data_parallel_size = dp;
  layout.expert_parallel_size = ep;
  layout.expert_data_parallel_size = world_size / ep;
  layout.num_local_experts = num_experts / ep;
  layout.global_batch_size = global_batch;
  layout.micro_batch_size = micro_batch;
  layout.micro_batches_per_step = global_batch / (dp * micro_batch);
  return layout;
}

ProcessGroups local_process_groups() {
  ProcessGroups groups;
  groups.world = std::make_unique<LocalCommunicator>();
  groups.tp = std::make_unique<LocalCommunicator>();
  groups.dp = std::make_unique<LocalCommunicator>();
  groups.ep = std::make_unique<LocalCommunicator>();
  groups.expert_dp = std::make_unique<LocalCommunicator>();
  groups.dp_background = std::make_unique<LocalCommunicator>();
  return groups;
}

ProcessGroups make_process_groups(const Layout& layout) {
  const MpiRuntime& runtime = MpiRuntime::get();
  SY_CHECK_MSG(layout.world_size == runtime.world_size(),
               "layout made for another world size than the job's");
  if (!runtime.launched()) return local_process_groups();
  ProcessGroups groups;
  std::unique_ptr<MpiCommunicator> world = MpiCommunicator::duplicate(MPI_COMM_WORLD);
  const int rank = world->rank();
  // Colors name the group; keys order it so group rank == the Layout's index.
  groups.tp = world->split(layout.dp_index(rank), layout.tp_index(rank));
  groups.dp = world->split(layout.tp_index(rank), layout.dp_index(rank));
  groups.ep = world->split(layout.expert_dp_index(rank), layout.ep_index(rank));
  groups.expert_dp = world->split(layout.ep_index(rank), layout.expert_dp_index(rank));
  groups.dp_background = world->split(layout.tp_index(rank), layout.dp_index(rank));
  groups.background_collectives = runtime.threads_communicate();
  groups.world = std::move(world);
  return groups;
}

}  // namespace switchyard
