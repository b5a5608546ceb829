#include "engine/parallel/topology.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/comm/local_communicator.h"
#include "core/config/recipe.h"
#include "core/runtime/status_macros.h"
#include "engine/parallel/mpi_communicator.h"
#include "engine/parallel/mpi_runtime.h"

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
  return strided_ranks(rank - tp_index(rank), tensor_parallel_size, 1);
}

std::vector<int> Layout::dp_group(int rank) const {
  return strided_ranks(pp_index(rank) * stage_size() + tp_index(rank), data_parallel_size,
                       tensor_parallel_size);
}

std::vector<int> Layout::ep_group(int rank) const {
  return strided_ranks(rank - ep_index(rank), expert_parallel_size, 1);
}

std::vector<int> Layout::expert_dp_group(int rank) const {
  return strided_ranks(pp_index(rank) * stage_size() + ep_index(rank), expert_data_parallel_size,
                       expert_parallel_size);
}

std::vector<int> Layout::pipeline_group(int rank) const {
  return strided_ranks(rank % stage_size(), pipeline_parallel_size, stage_size());
}

PipelineShape Layout::pipeline_shape() const {
  PipelineShape shape;
  shape.stages = pipeline_parallel_size;
  shape.virtual_chunks = virtual_pipeline_size;
  shape.micro_batches = static_cast<int>(micro_batches_per_step);
  switch (pipeline_schedule) {
    case config::GPIPE:
      shape.schedule = PipelineScheduleKind::kGpipe;
      break;
    case config::INTERLEAVED_1F1B:
      shape.schedule = PipelineScheduleKind::kInterleaved1F1B;
      break;
    default:
      shape.schedule = PipelineScheduleKind::kOneFOneB;
  }
  return shape;
}

absl::StatusOr<Layout> make_layout(const config::Recipe& recipe, int world_size) {
  const config::ParallelConfig& parallel = recipe.parallel();
  const config::ModelConfig& model = recipe.model();
  const config::TrainConfig& train = recipe.train();
  if (world_size < 1) return invalid(absl::StrCat("world size (", world_size, ") must be >= 1"));
  const int tp = parallel.tensor_parallel_size() == 0 ? 1 : parallel.tensor_parallel_size();
  const int ep = parallel.expert_parallel_size() == 0 ? 1 : parallel.expert_parallel_size();
  const int pp = config::effective_pipeline_size(parallel);
  if (tp < 1) return invalid(absl::StrCat("parallel.tensor_parallel_size (", tp, ") must be >= 1"));
  if (ep < 1) return invalid(absl::StrCat("parallel.expert_parallel_size (", ep, ") must be >= 1"));
  if (pp < 1)
    return invalid(absl::StrCat("parallel.pipeline_parallel_size (", pp, ") must be >= 1"));
  if (world_size % pp != 0) {
    return invalid(absl::StrCat("parallel.pipeline_parallel_size (", pp,
                                ") must divide the world size (", world_size, ")"));
  }
  // Every other group lies inside one pipeline stage.
  const int stage = world_size / pp;
  const std::string ranks =
      pp == 1 ? absl::StrCat("the world size (", world_size, ")")
              : absl::StrCat("the ranks per pipeline stage (", stage, ": the world size ", world_size,
                             " / parallel.pipeline_parallel_size ", pp, ")");
  if (stage % tp != 0) {
    return invalid(
        absl::StrCat("parallel.tensor_parallel_size (", tp, ") must divide ", ranks));
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
  if (stage % ep != 0) {
    return invalid(
        absl::StrCat("parallel.expert_parallel_size (", ep, ") must divide ", ranks));
  }
  const int num_experts = recipe.moe().num_experts();
  if (num_experts % ep != 0) {
    return invalid(absl::StrCat("moe.num_experts (", num_experts,
                                ") must be divisible by parallel.expert_parallel_size (", ep, ")"));
  }
  const int dp = stage / tp;
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
  layout.pipeline_parallel_size = pp;
  layout.virtual_pipeline_size = config::effective_virtual_pipeline_size(parallel);
  layout.pipeline_schedule = config::effective_pipeline_schedule(parallel);
  layout.tensor_parallel_size = tp;
  layout.data_parallel_size = dp;
  layout.expert_parallel_size = ep;
  layout.expert_data_parallel_size = stage / ep;
  layout.num_local_experts = num_experts / ep;
  layout.global_batch_size = global_batch;
  layout.micro_batch_size = micro_batch;
  layout.micro_batches_per_step = global_batch / (dp * micro_batch);
  // A layout of one stage that asks for no schedule runs the plain micro-batch loop,
  // whatever its micro-batch count.
  if (pp > 1 || layout.virtual_pipeline_size > 1 ||
      parallel.pipeline_schedule() != config::PIPELINE_SCHEDULE_UNSPECIFIED)
    SY_RETURN_IF_ERROR(validate_pipeline_shape(layout.pipeline_shape()));
  return layout;
}

ProcessGroups local_process_groups() {
  ProcessGroups groups;
  groups.world = std::make_unique<LocalCommunicator>();
  groups.tp = std::make_unique<LocalCommunicator>();
  groups.dp = std::make_unique<LocalCommunicator>();
  groups.ep = std::make_unique<LocalCommunicator>();
  groups.expert_dp = std::make_unique<LocalCommunicator>();
  groups.pipeline = std::make_unique<LocalCommunicator>();
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
  // Colors name the group (its first member, unique across groups of one kind); keys
  // order it so group rank == the Layout's index.
  auto split = [&](const std::vector<int>& members, int index) {
    return world->split(members.front(), index);
  };
  groups.tp = split(layout.tp_group(rank), layout.tp_index(rank));
  groups.dp = split(layout.dp_group(rank), layout.dp_index(rank));
  groups.ep = split(layout.ep_group(rank), layout.ep_index(rank));
  groups.expert_dp = split(layout.expert_dp_group(rank), layout.expert_dp_index(rank));
  groups.pipeline = split(layout.pipeline_group(rank), layout.pp_index(rank));
  groups.dp_background = split(layout.dp_group(rank), layout.dp_index(rank));
  groups.background_collectives = runtime.threads_communicate();
  groups.world = std::move(world);
  return groups;
}

}  // namespace switchyard
