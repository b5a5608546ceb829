// Pipeline layouts and point-to-point messages: make_layout's pipeline groups and
// checks, and every schedule's action list run over real communicators, the world being
// the pipeline (P = world size). Each pass checks that its input is the one its
// predecessor produced for the same micro-batch, so a message matched to the wrong
// receive, or a hang, fails the test.
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/parallel/mpi_runtime.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"

namespace switchyard {
namespace {

using ::testing::HasSubstr;

config::Recipe pipeline_recipe(int pp, int tp, int ep) {
  config::Recipe recipe;
  recipe.mutable_model()->set_num_heads(8);
  recipe.mutable_model()->set_num_kv_heads(4);
  recipe.mutable_model()->set_num_layers(8);
  recipe.mutable_moe()->set_num_experts(8);
  recipe.mutable_parallel()->set_pipeline_parallel_size(pp);
  recipe.mutable_parallel()->set_tensor_parallel_size(tp);
  recipe.mutable_parallel()->set_expert_parallel_size(ep);
  recipe.mutable_train()->set_global_batch_size(16);
  recipe.mutable_train()->set_micro_batch_size(2);
  return recipe;
}

TEST(PipelineLayoutTest, StagesAreBlocksOfConsecutiveRanks) {
  // 8 ranks: pp 2 x dp 2 x tp 2, ep 2 inside each stage.
  absl::StatusOr<Layout> layout = make_layout(pipeline_recipe(2, 2, 2), 8);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->stage_size(), 4);
  EXPECT_EQ(layout->data_parallel_size, 2);
  EXPECT_EQ(layout->expert_data_parallel_size, 2);
  EXPECT_EQ(layout->micro_batches_per_step, 4);  // 16 / (dp 2 x micro 2)
  EXPECT_EQ(layout->pipeline_group(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(layout->tp_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(layout->dp_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(layout->ep_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(layout->expert_dp_group(5), (std::vector<int>{5, 7}));
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(layout->pipeline_group(rank)[layout->pp_index(rank)], rank);
    EXPECT_EQ(layout->dp_group(rank)[layout->dp_index(rank)], rank);
    EXPECT_EQ(layout->expert_dp_group(rank)[layout->expert_dp_index(rank)], rank);
  }
}

void expect_layout_error(const config::Recipe& recipe, int world_size, const std::string& part) {
  absl::StatusOr<Layout> layout = make_layout(recipe, world_size);
  ASSERT_FALSE(layout.ok()) << "expected an error with " << part;
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr(part));
  EXPECT_EQ(std::string(layout.status().message()).find('\n'), std::string::npos);
}

TEST(PipelineLayoutTest, ErrorsNameTheField) {
  expect_layout_error(pipeline_recipe(3, 1, 1), 4,
                      "parallel.pipeline_parallel_size (3) must divide the world size (4)");
  expect_layout_error(pipeline_recipe(2, 4, 1), 4,
                      "parallel.tensor_parallel_size (4) must divide the ranks per pipeline "
                      "stage (2: the world size 4 / parallel.pipeline_parallel_size 2)");
  expect_layout_error(pipeline_recipe(2, 1, 4), 4,
                      "parallel.expert_parallel_size (4) must divide the ranks per pipeline stage");
  config::Recipe interleaved = pipeline_recipe(4, 1, 1);
  interleaved.mutable_parallel()->set_virtual_pipeline_size(2);
  interleaved.mutable_train()->set_global_batch_size(12);
  interleaved.mutable_train()->set_micro_batch_size(2);
  expect_layout_error(interleaved, 4,
                      "INTERLEAVED_1F1B needs the micro-batches per step (6) to be a multiple of "
                      "parallel.pipeline_parallel_size (4)");
  config::Recipe gpipe = pipeline_recipe(2, 1, 1);
  gpipe.mutable_parallel()->set_virtual_pipeline_size(2);
  gpipe.mutable_parallel()->set_pipeline_schedule(config::GPIPE);
  expect_layout_error(gpipe, 2, "parallel.virtual_pipeline_size (2) must be 1");
}

// The members of `group` as world ranks, in group-rank order.
std::vector<int> members(Communicator& group) {
  Tensor mine = Tensor::empty({1}, DType::kI64);
  mine.data<int64_t>()[0] = testing::world().rank();
  Tensor all = Tensor::empty({group.size()}, DType::kI64);
  group.all_gather(mine, all);
  return std::vector<int>(all.data<int64_t>(), all.data<int64_t>() + group.size());
}

// Under mpirun: pp = the world size, then pp 2 when the world is larger.
TEST(PipelineLayoutTest, ProcessGroupsHoldTheLayoutsRanks) {
  const int world_size = testing::world().size();
  const int rank = testing::world().rank();
  for (int pp : {world_size, 2}) {
    if (world_size % pp != 0 || (pp == 2 && world_size < 4)) continue;
    absl::StatusOr<Layout> layout = make_layout(pipeline_recipe(pp, 1, 1), world_size);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ProcessGroups groups = make_process_groups(*layout);
    EXPECT_EQ(members(*groups.pipeline), layout->pipeline_group(rank));
    EXPECT_EQ(members(*groups.dp), layout->dp_group(rank));
    EXPECT_EQ(members(*groups.expert_dp), layout->expert_dp_group(rank));
  }
}

// Runs `shape`'s actions for this rank over `pipeline`: a forward of micro-batch i on
// model chunk k turns the input value (i, k - 1) into (i, k), a backward the gradient
// value (i, k + 1) into (i, k).
void run_actions(const PipelineShape& shape, Communicator& pipeline) {
  const int rank = pipeline.rank();
  auto value = [](int micro_batch, int model_chunk) {
    return static_cast<float>(1000 * micro_batch + model_chunk);
  };
  // Tensors received (inputs) and produced (outputs), by (kind, micro-batch, chunk).
  using Key = std::tuple<TransferKind, int, int>;
  std::map<Key, Tensor> inputs;
  std::map<Key, Tensor> outputs;
  for (const PipelineAction& action : pipeline_actions(shape, rank)) {
    if (action.kind == ActionKind::kExchange) {
      std::vector<Communicator::Message> messages;
      for (const Transfer& t : action.transfers) {
        const Key key{t.kind, t.micro_batch, t.chunk};
        Tensor tensor = t.send ? outputs.at(key) : Tensor::empty({3}, DType::kF32);
        if (!t.send) inputs[key] = tensor;
        messages.push_back({t.send, t.peer, tensor});
      }
      pipeline.exchange(messages);
      continue;
    }
    const bool forward = action.kind == ActionKind::kForward;
    const int k = shape.model_chunk(rank, action.chunk);
    const int from = forward ? k - 1 : k + 1;
    const TransferKind kind = forward ? TransferKind::kActivation : TransferKind::kGradient;
    const Key key{kind, action.micro_batch, action.chunk};
    if (from >= 0 && from < shape.num_chunks()) {
      ASSERT_TRUE(inputs.count(key)) << "no input for micro-batch " << action.micro_batch;
      EXPECT_THAT(testing::values_of<float>(inputs.at(key)),
                  ::testing::Each(value(action.micro_batch, from)));
      inputs.erase(key);
    }
    outputs[key] =
        testing::host_tensor<float>({3}, std::vector<float>(3, value(action.micro_batch, k)));
  }
  EXPECT_TRUE(inputs.empty());
}

TEST(PipelineExchangeTest, EveryScheduleDeliversEachMessageToItsPass) {
  Communicator& world = testing::world();
  const int p = world.size();
  std::vector<PipelineShape> shapes;
  for (int m : {1, 3, 4}) {
    shapes.push_back({p, 1, m, PipelineScheduleKind::kGpipe});
    shapes.push_back({p, 1, m, PipelineScheduleKind::kOneFOneB});
  }
  if (p > 1) {
    shapes.push_back({p, 2, p, PipelineScheduleKind::kInterleaved1F1B});
    shapes.push_back({p, 3, 2 * p, PipelineScheduleKind::kInterleaved1F1B});
  }
  for (const PipelineShape& shape : shapes) {
    SCOPED_TRACE(pipeline_schedule_name(shape.schedule) + " V=" +
                 std::to_string(shape.virtual_chunks) + " m=" +
                 std::to_string(shape.micro_batches));
    run_actions(shape, world);
  }
}

}  // namespace
}  // namespace switchyard
