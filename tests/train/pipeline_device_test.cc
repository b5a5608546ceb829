// What pipeline training moves between host and device for a device communicator
// (docs/pipeline.md): the routing sums a message carries beside its tensor, packed on the
// host and moved to the message's device, read back through the host, every double's
// bits intact; the receive buffers, on the stage's device; and the final weights,
// broadcast on the pipeline group's device and returned on the host. A second
// host-memory device stands in for a GPU: its copies go through copy_from_host and
// copy_to_host, as a CudaDevice's do.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/local_communicator.h"
#include "core/config/recipe.h"
#include "engine/train/pipeline_training.h"

namespace switchyard {
namespace {

// Host memory, but a device of its own: tensors move to and from it by upload/download.
class StagingDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kCpu; }
  std::string name() const override { return "staging"; }
  int64_t available_bytes() const override { return int64_t{1} << 30; }

 protected:
  void* raw_allocate(size_t bytes) override { return std::malloc(bytes == 0 ? 1 : bytes); }
  void raw_deallocate(void* ptr) override { std::free(ptr); }
};

std::vector<uint64_t> bits(const std::vector<double>& values) {
  std::vector<uint64_t> out;
  for (double v : values) out.push_back(std::bit_cast<uint64_t>(v));
  return out;
}

RoutingSums awkward_sums() {
  RoutingSums sums;
  sums.selections = {0.0, -0.0, 3.0, std::numeric_limits<double>::denorm_min(), 9007199254740993.0};
  sums.prob_sums = {0.1, std::numeric_limits<double>::infinity(),
                    std::bit_cast<double>(uint64_t{0x7ff8000000000123}), 1e308, -2.5};
  sums.tokens = (int64_t{1} << 53) - 1;
  sums.layer_aux_sum = std::numeric_limits<double>::denorm_min();
  sums.z_loss = -0.0;
  sums.seq_aux_loss = std::bit_cast<double>(uint64_t{0x7ff0000000000456});
  return sums;
}

// The sums' scalars as bits.
std::vector<uint64_t> scalar_bits(const RoutingSums& sums) {
  return {static_cast<uint64_t>(sums.tokens), std::bit_cast<uint64_t>(sums.layer_aux_sum),
          std::bit_cast<uint64_t>(sums.z_loss), std::bit_cast<uint64_t>(sums.seq_aux_loss)};
}

TEST(PipelineSide, RoundTripsEveryBitOnTheCpu) {
  const RoutingSums sums = awkward_sums();
  const Tensor side = pack_routing_sums(sums, 5, cpu_device());
  EXPECT_EQ(&side.device(), &cpu_device());
  EXPECT_EQ(side.dtype(), DType::kI64);
  EXPECT_EQ(side.numel(), routing_sums_side_elements(5));
  const RoutingSums back = unpack_routing_sums(side, 5);
  EXPECT_EQ(bits(back.selections), bits(sums.selections));
  EXPECT_EQ(bits(back.prob_sums), bits(sums.prob_sums));
  EXPECT_EQ(scalar_bits(back), scalar_bits(sums));
}

TEST(PipelineSide, LivesOnTheMessagesDeviceAndIsReadThroughTheHost) {
  StagingDevice dev;
  const RoutingSums sums = awkward_sums();
  const Tensor side = pack_routing_sums(sums, 5, dev);
  EXPECT_EQ(&side.device(), &dev);
  EXPECT_EQ(dev.host_transfers(), 1);  // the packed host tensor, uploaded once
  // A receive buffer on the device, filled as an exchange would fill it.
  Tensor received =
      Tensor::empty({routing_sums_side_elements(5)}, DType::kI64, MemoryKind::kOther, dev);
  received.copy_from(side);
  const RoutingSums back = unpack_routing_sums(received, 5);
  EXPECT_EQ(dev.host_transfers(), 2);  // one download to read it
  EXPECT_EQ(bits(back.selections), bits(sums.selections));
  EXPECT_EQ(bits(back.prob_sums), bits(sums.prob_sums));
  EXPECT_EQ(scalar_bits(back), scalar_bits(sums));
}

// A first chunk without MoE layers before it has no sums yet: zeros travel.
TEST(PipelineSide, EmptySumsTravelAsZeros) {
  StagingDevice dev;
  const RoutingSums back = unpack_routing_sums(pack_routing_sums(RoutingSums(), 3, dev), 3);
  EXPECT_EQ(back.selections, std::vector<double>(3, 0.0));
  EXPECT_EQ(back.prob_sums, std::vector<double>(3, 0.0));
  EXPECT_EQ(scalar_bits(back), scalar_bits(RoutingSums()));
}

TEST(PipelineSideDeathTest, RefusesASideOfAnotherExpertCount) {
  const Tensor side = pack_routing_sums(awkward_sums(), 5, cpu_device());
  EXPECT_DEATH(unpack_routing_sums(side, 4), "routing sums side of the wrong size");
}

config::Recipe tiny_with_layers(int layers) {
  const std::filesystem::path root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  absl::StatusOr<config::Recipe> recipe = config::load_recipe(
      (root / "recipes/tiny.textproto").string(), {"model.num_layers=" + std::to_string(layers)});
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

// Every whole weight of `recipe`'s model, by name, on the host: 0.5, 0.75, 1.0, ...
std::vector<std::pair<std::string, Tensor>> counted_weights(const config::Recipe& recipe) {
  ParamStore params;
  const Transformer model(recipe, params, {});
  std::vector<std::pair<std::string, Tensor>> weights;
  float next = 0.5f;
  for (const Param& p : params.params()) {
    Tensor value = Tensor::empty(p.whole_shape);
    for (int64_t i = 0; i < value.numel(); ++i, next += 0.25f) value.data<float>()[i] = next;
    weights.emplace_back(p.name, value);
  }
  return weights;
}

// A stage's receive buffers, the activation or gradient and the routing sums' side, are
// allocated where its passes compute, as an exchange on a device communicator needs.
TEST(PipelineStages, ReceiveBuffersLiveOnTheStagesDevice) {
  config::Recipe recipe = tiny_with_layers(2);
  recipe.mutable_moe()->set_aux_loss_per_layer(false);
  ParamStore params;
  std::vector<std::unique_ptr<Transformer>> chunks;
  chunks.push_back(
      std::make_unique<Transformer>(recipe, params, ModelParallel{}, ModelChunk{1, 1}));
  const std::vector<MicroBatchInput> inputs = {{Tensor::zeros({2, 8}, DType::kI32),
                                                Tensor::zeros({2, 8}, DType::kI32), Tensor(),
                                                Tensor(), Rng(1)}};
  StagingDevice dev;
  ChunkStages stages(dev, chunks, inputs, recipe.model().hidden_size(), DType::kF32, 1.0f, 16.0,
                     nullptr, [](int, const LossParts&, const RouterStats&) {});
  const StageMessage buffer = stages.receive_buffer(TransferKind::kActivation, 0, 0);
  EXPECT_EQ(&buffer.tensor.device(), &dev);
  EXPECT_EQ(buffer.tensor.shape(), (Shape{16, recipe.model().hidden_size()}));
  ASSERT_TRUE(buffer.side.defined());
  EXPECT_EQ(&buffer.side.device(), &dev);
  EXPECT_EQ(buffer.side.numel(), routing_sums_side_elements(recipe.moe().num_experts()));
}

// The whole model's weights of a one-stage layout: every tensor goes to the group's
// device for its broadcast and comes back to the host with its bytes.
TEST(PipelineWeights, GatherThroughTheGroupsDeviceReturnsHostTensors) {
  const config::Recipe recipe = tiny_with_layers(2);
  absl::StatusOr<Layout> layout = make_layout(recipe, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<std::pair<std::string, Tensor>> mine = counted_weights(recipe);
  StagingDevice dev;
  // A group of one whose tensors live on `dev`, as a device communicator's on its GPU.
  LocalCommunicator pipeline(dev);
  const std::vector<std::pair<std::string, Tensor>> whole =
      gather_pipeline_weights(recipe, *layout, mine, pipeline);
  ASSERT_EQ(whole.size(), mine.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].first, mine[i].first);
    EXPECT_EQ(&whole[i].second.device(), &cpu_device());
    ASSERT_EQ(whole[i].second.shape(), mine[i].second.shape());
    EXPECT_EQ(
        std::memcmp(whole[i].second.raw_data(), mine[i].second.raw_data(), mine[i].second.nbytes()),
        0)
        << whole[i].first;
  }
  // Up to the group's device and back, once each.
  EXPECT_EQ(dev.host_transfers(), 2 * static_cast<int64_t>(mine.size()));
}

// On a host communicator nothing is copied: the held tensors come back themselves.
TEST(PipelineWeights, GatherOnTheHostCopiesNothing) {
  const config::Recipe recipe = tiny_with_layers(1);
  absl::StatusOr<Layout> layout = make_layout(recipe, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<std::pair<std::string, Tensor>> mine = counted_weights(recipe);
  LocalCommunicator pipeline;
  const std::vector<std::pair<std::string, Tensor>> whole =
      gather_pipeline_weights(recipe, *layout, mine, pipeline);
  ASSERT_EQ(whole.size(), mine.size());
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(whole[i].second.raw_data(), mine[i].second.raw_data()) << whole[i].first;
}

}  // namespace
}  // namespace switchyard
