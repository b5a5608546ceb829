// The memory plan of `train --dry-run` and of the trainer's fit check: every rank of a
// layout from the shards it registers, without allocating.
#include "engine/train/memory_plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/config/recipe.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();
constexpr double kMiB = 1 << 20;

config::Recipe tiny(const std::vector<std::string>& overrides) {
  absl::StatusOr<config::Recipe> recipe =
      config::load_recipe((kRoot / "recipes/tiny.textproto").string(), overrides);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

std::vector<RankMemory> plan(const config::Recipe& recipe, int world) {
  absl::StatusOr<Layout> layout = make_layout(recipe, world);
  if (!layout.ok()) ADD_FAILURE() << layout.status();
  if (!layout.ok()) return {};
  return plan_rank_memory(recipe, *layout, DType::kF32);
}

TEST(MemoryPlanTest, OneRankHoldsEveryParameterGradientAndAdamMoment) {
  const std::vector<RankMemory> ranks = plan(tiny({}), 1);
  ASSERT_EQ(ranks.size(), 1u);
  // 3,609,728 fp32 parameters: values and gradients 8 bytes each, AdamW's moments 8.
  EXPECT_EQ(ranks[0].weights_and_gradients, 3609728.0 * 8);
  EXPECT_EQ(ranks[0].optimizer_state, 3609728.0 * 8);
  // micro-batch 8 x 128 tokens x hidden 128 x 4 layers, fp32.
  EXPECT_EQ(ranks[0].layer_inputs, 4.0 * 8 * 128 * 128 * 4);
}

TEST(MemoryPlanTest, ExpertParallelRanksEachHoldTheirShareOfTheExperts) {
  const config::Recipe recipe = tiny({"parallel.expert_parallel_size=4", "train.micro_batch_size=4"});
  const std::vector<RankMemory> ranks = plan(recipe, 4);
  ASSERT_EQ(ranks.size(), 4u);
  const double dense = 3609728.0 - 3145728.0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].rank, r);
    EXPECT_EQ(ranks[r].ep_index, r);
    EXPECT_EQ(ranks[r].weights_and_gradients, (dense + 3145728.0 / 4) * 8);
  }
}

TEST(MemoryPlanTest, ZeroStagesShardDenseGradientsAndValues) {
  const double one = plan(tiny({"parallel.zero_stage=1"}), 2)[0].total();
  const double two = plan(tiny({"parallel.zero_stage=2"}), 2)[0].total();
  const double three = plan(tiny({"parallel.zero_stage=3"}), 2)[0].total();
  EXPECT_LT(two, one);
  EXPECT_LT(three, two);
  EXPECT_LT(plan(tiny({"parallel.zero_stage=1"}), 2)[0].optimizer_state,
            plan(tiny({}), 2)[0].optimizer_state);
}

TEST(MemoryPlanTest, DescribesARankInOneLine) {
  RankMemory m;
  m.rank = 3;
  m.ep_index = 3;
  m.weights_and_gradients = 64.0 * (1 << 30);
  m.optimizer_state = 8 * kMiB;
  m.layer_inputs = 2 * kMiB;
  EXPECT_EQ(describe_rank_memory(m),
            "rank 3 (tp 0, ep 3): at least 64.01 GiB: weights and gradients 64.00 GiB, "
            "optimizer state 8.0 MiB, layer inputs 2.0 MiB");
}

TEST(MemoryPlanTest, WarnsOnlyWhenTheNeedFitsWithLessThanATenthToSpare) {
  EXPECT_EQ(tight_fit_warning("cuda:0", 70 * kMiB, 80 * kMiB), "");
  EXPECT_EQ(tight_fit_warning("cuda:0", 90 * kMiB, 80 * kMiB), "");  // check_fits refuses it
  EXPECT_EQ(tight_fit_warning("cuda:0", 76 * kMiB, -1), "");
  EXPECT_EQ(tight_fit_warning("cuda:0", 76 * kMiB, 80 * kMiB),
            "warning: this run needs at least 76.0 MiB on cuda:0 before its first step, 95% of "
            "the 80.0 MiB available there; the activations beyond the layer inputs may not fit "
            "(use a smaller micro-batch, or more ranks)");
}

}  // namespace
}  // namespace switchyard
