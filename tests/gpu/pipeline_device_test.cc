// Pipeline training's host <-> GPU moves on a real GPU (tests/train/pipeline_device_test.cc
// runs them with a host-memory stand-in): the routing sums a stage message carries, on
// the GPU and back with every bit, after GPU work queued before them; and the final
// weights gathered over an NCCL communicator, broadcast on its GPU and returned on the
// host. One process: NCCL refuses two ranks of a communicator on one GPU, so the
// stage-to-stage exchanges themselves run in tests/parallel/test_gpu_train_equivalence.py
// on two GPUs or more.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/local_communicator.h"
#include "core/config/recipe.h"
#include "engine/parallel/nccl_communicator.h"
#include "engine/train/pipeline_training.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

std::vector<uint64_t> bits(const std::vector<double>& values) {
  std::vector<uint64_t> out;
  for (double v : values) out.push_back(std::bit_cast<uint64_t>(v));
  return out;
}

TEST(PipelineDeviceTest, RoutingSumsCrossTheGpuWithEveryBit) {
  CudaDevice dev(0);
  RoutingSums sums;
  sums.selections = {0.0, -0.0, 3.0, std::numeric_limits<double>::denorm_min()};
  sums.prob_sums = {0.1, std::numeric_limits<double>::infinity(),
                    std::bit_cast<double>(uint64_t{0x7ff8000000000123}), -2.5};
  sums.tokens = (int64_t{1} << 53) - 1;
  sums.layer_aux_sum = 0.125;
  sums.z_loss = -0.0;
  sums.seq_aux_loss = std::numeric_limits<double>::denorm_min();
  // Work queued on the compute stream before the side: the copies follow it in order.
  Tensor busy = Tensor::zeros({int64_t{1} << 24}, DType::kF32, MemoryKind::kOther, dev);
  for (int i = 0; i < 50; ++i) scale_(dev, busy, 0.5f);
  const Tensor side = pack_routing_sums(sums, 4, dev);
  EXPECT_TRUE(side.device().is_cuda());
  // A receive buffer on the GPU, filled on the device as an exchange fills it.
  Tensor received =
      Tensor::empty({routing_sums_side_elements(4)}, DType::kI64, MemoryKind::kOther, dev);
  received.copy_from(side);
  const RoutingSums back = unpack_routing_sums(received, 4);
  EXPECT_EQ(bits(back.selections), bits(sums.selections));
  EXPECT_EQ(bits(back.prob_sums), bits(sums.prob_sums));
  EXPECT_EQ(back.tokens, sums.tokens);
  EXPECT_EQ(bits({back.layer_aux_sum, back.z_loss, back.seq_aux_loss}),
            bits({sums.layer_aux_sum, sums.z_loss, sums.seq_aux_loss}));
}

TEST(PipelineDeviceTest, FinalWeightsGatherOverNcclAndReturnOnTheHost) {
  const std::filesystem::path root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  absl::StatusOr<config::Recipe> recipe =
      config::load_recipe((root / "recipes/tiny.textproto").string(), {"model.num_layers=2"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  absl::StatusOr<Layout> layout = make_layout(*recipe, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ParamStore params;
  const Transformer model(*recipe, params, {});
  std::vector<std::pair<std::string, Tensor>> mine;
  float next = 0.5f;
  for (const Param& p : params.params()) {
    Tensor value = Tensor::empty(p.whole_shape);
    for (int64_t i = 0; i < value.numel(); ++i, next += 0.25f) value.data<float>()[i] = next;
    mine.emplace_back(p.name, value);
  }
  CudaDevice dev(0);
  LocalCommunicator cpu;
  const std::unique_ptr<NcclCommunicator> pipeline = NcclCommunicator::create(cpu, dev);
  const int64_t transfers_before = dev.host_transfers();
  const std::vector<std::pair<std::string, Tensor>> whole =
      gather_pipeline_weights(*recipe, *layout, mine, *pipeline);
  ASSERT_EQ(whole.size(), mine.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].first, mine[i].first);
    EXPECT_FALSE(whole[i].second.device().is_cuda());
    EXPECT_EQ(
        std::memcmp(whole[i].second.raw_data(), mine[i].second.raw_data(), mine[i].second.nbytes()),
        0)
        << whole[i].first;
  }
  // Each tensor went to the GPU and back.
  EXPECT_EQ(dev.host_transfers() - transfers_before, 2 * static_cast<int64_t>(mine.size()));
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
