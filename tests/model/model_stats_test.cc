// Parameter counts of the shipped full-size recipes against the published figures.
#include "engine/model/model_stats.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/config/recipe.h"

namespace switchyard {
namespace {

std::string recipe_path(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "recipes" /
          (name + ".textproto"))
      .string();
}

ModelStats stats_of(const std::string& name) {
  auto recipe = config::load_recipe(recipe_path(name), {});
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return compute_model_stats(*recipe);
}

TEST(ModelStats, MixtralMatchesPublishedCounts) {
  // Mixtral-8x7B: 46.7B parameters, 12.9B active (the exact count of the released
  // checkpoint is 46,702,792,704).
  const ModelStats s = stats_of("mixtral-8x7b");
  EXPECT_EQ(s.total_params, 46702792704);
  EXPECT_NEAR(s.active_params / 1e9, 12.9, 0.05);
}

TEST(ModelStats, OlmoeMatchesPublishedCounts) {
  // OLMoE-1B-7B: 6.9B total, 1.3B active.
  const ModelStats s = stats_of("olmoe-1b-7b");
  EXPECT_NEAR(s.total_params / 1e9, 6.92, 0.01);
  EXPECT_NEAR(s.active_params / 1e9, 1.28, 0.01);
}

TEST(ModelStats, QwenMoeMatchesPublishedCounts) {
  // Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated.
  const ModelStats s = stats_of("qwen-moe-a2.7b");
  EXPECT_NEAR(s.total_params / 1e9, 14.3, 0.05);
  EXPECT_NEAR(s.active_params / 1e9, 2.7, 0.05);
}

TEST(ModelStats, Qwen3MoeMatchesPublishedCounts) {
  // Qwen3-30B-A3B: 30.5B total (the released checkpoint holds 30,532,122,624), 3.3B
  // activated; Qwen3-235B-A22B: 235B total, 22B activated.
  const ModelStats small = stats_of("qwen3-30b-a3b");
  EXPECT_EQ(small.total_params, 30532122624);
  EXPECT_NEAR(small.active_params / 1e9, 3.35, 0.01);
  const ModelStats large = stats_of("qwen3-235b-a22b");
  EXPECT_NEAR(large.total_params / 1e9, 235.09, 0.01);
  EXPECT_NEAR(large.active_params / 1e9, 22.19, 0.01);
}

TEST(ModelStats, FlopsFollowActiveParameters) {
  const ModelStats s = stats_of("mixtral-8x7b");
  auto recipe = config::load_recipe(recipe_path("mixtral-8x7b"), {});
  ASSERT_TRUE(recipe.ok());
  const auto& m = recipe->model();
  const double attention = 4.0 * m.num_layers() * recipe->train().seq_len() * m.num_heads() *
                           m.head_dim();
  const double embed = static_cast<double>(m.vocab_size()) * m.hidden_size();
  EXPECT_DOUBLE_EQ(s.forward_flops_per_token, 2.0 * (s.active_params - embed) + attention);
  EXPECT_DOUBLE_EQ(s.train_flops_per_token, 3.0 * s.forward_flops_per_token);
}

}  // namespace
}  // namespace switchyard
