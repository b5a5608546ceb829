// The pipeline fields of `parallel`: their defaults, the layer split and its refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config/recipe.h"

namespace switchyard::config {
namespace {

constexpr char kRecipe[] = R"pb(
  name: "pipeline"
  model { vocab_size: 512 hidden_size: 64 num_layers: 10 num_heads: 4 moe_layer_interval: 1 }
  moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 128 }
  optimizer { lr: 1e-3 }
  train { global_batch_size: 8 micro_batch_size: 2 seq_len: 32 steps: 10 }
  data { corpus: "corpus.txt" }
)pb";

Recipe recipe_with(const std::string& parallel) {
  absl::StatusOr<Recipe> recipe =
      parse_recipe(absl::StrCat(kRecipe, " parallel { ", parallel, " }"), "pipeline");
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *recipe : Recipe();
}

TEST(PipelineRecipeTest, DefaultsAreOneStageOneChunkAndOneFOneB) {
  const Recipe recipe = recipe_with("");
  ASSERT_TRUE(validate_recipe(recipe).ok()) << validate_recipe(recipe);
  EXPECT_EQ(effective_pipeline_size(recipe.parallel()), 1);
  EXPECT_EQ(effective_virtual_pipeline_size(recipe.parallel()), 1);
  EXPECT_EQ(effective_pipeline_schedule(recipe.parallel()), ONE_F_ONE_B);
  EXPECT_EQ(pipeline_chunk_layers(recipe), std::vector<int>{10});
  EXPECT_EQ(effective_pipeline_schedule(recipe_with("virtual_pipeline_size: 2").parallel()),
            INTERLEAVED_1F1B);
  EXPECT_EQ(effective_pipeline_schedule(recipe_with("pipeline_schedule: GPIPE").parallel()), GPIPE);
}

TEST(PipelineRecipeTest, LayersSplitEvenlyOrAsListed) {
  EXPECT_EQ(pipeline_chunk_layers(recipe_with("pipeline_parallel_size: 4")),
            (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(pipeline_chunk_layers(
                recipe_with("pipeline_parallel_size: 2 virtual_pipeline_size: 2")),
            (std::vector<int>{3, 3, 2, 2}));
  const Recipe listed = recipe_with("pipeline_parallel_size: 2 pipeline_layers: [4, 6]");
  ASSERT_TRUE(validate_recipe(listed).ok()) << validate_recipe(listed);
  EXPECT_EQ(pipeline_chunk_layers(listed), (std::vector<int>{4, 6}));
}

TEST(PipelineRecipeTest, RefusesInOneLineNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"pipeline_parallel_size: -1", "parallel.pipeline_parallel_size (-1) must be >= 0"},
      {"virtual_pipeline_size: -2", "parallel.virtual_pipeline_size (-2) must be >= 0"},
      {"pipeline_parallel_size: 11",
       "parallel.pipeline_parallel_size x parallel.virtual_pipeline_size (11 chunks) must be <= "
       "model.num_layers (10)"},
      {"pipeline_parallel_size: 4 virtual_pipeline_size: 3", "(12 chunks) must be <="},
      {"pipeline_parallel_size: 2 pipeline_layers: [10]",
       "parallel.pipeline_layers has 1 entries; it needs one per chunk"},
      {"pipeline_parallel_size: 2 pipeline_layers: [10, 0]",
       "parallel.pipeline_layers[1] (0) must be >= 1"},
      {"pipeline_parallel_size: 2 pipeline_layers: [3, 4]",
       "parallel.pipeline_layers sum to 7 layers; they must sum to model.num_layers (10)"},
      {"pipeline_parallel_size: 2 pipeline_layers: [2147483647, 2147483647]",
       "parallel.pipeline_layers sum to 4294967294 layers"},
  };
  for (const auto& [parallel, message] : cases) {
    SCOPED_TRACE(parallel);
    const absl::Status status = validate_recipe(recipe_with(parallel));
    ASSERT_FALSE(status.ok());
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << status;
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  }
  absl::StatusOr<Recipe> tied = parse_recipe(
      absl::StrCat(kRecipe, " parallel { pipeline_parallel_size: 2 }"), "tied");
  ASSERT_TRUE(tied.ok());
  tied->mutable_model()->set_tie_embeddings(true);
  EXPECT_NE(std::string(validate_recipe(*tied).message())
                .find("model.tie_embeddings needs parallel.pipeline_parallel_size 1"),
            std::string::npos);
}

}  // namespace
}  // namespace switchyard::config
