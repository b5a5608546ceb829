// The pipeline fields of `parallel`: their defaults, the layer split and its refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "tests/config/parallel_recipe.h"

namespace switchyard::config {
namespace {

Recipe recipe_with(const std::string& parallel) {
  return testing::recipe_with_parallel("pipeline", /*num_layers=*/10, parallel);
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
  EXPECT_EQ(
      pipeline_chunk_layers(recipe_with("pipeline_parallel_size: 2 virtual_pipeline_size: 2")),
      (std::vector<int>{3, 3, 2, 2}));
  const Recipe listed = recipe_with("pipeline_parallel_size: 2 pipeline_layers: [4, 6]");
  ASSERT_TRUE(validate_recipe(listed).ok()) << validate_recipe(listed);
  EXPECT_EQ(pipeline_chunk_layers(listed), (std::vector<int>{4, 6}));
}

// The embedding and the head count as a layer each: 12 slots over 4 stages are 3 each,
// so the end stages hold 2 layers; 12 over 5 chunks give the first two a slot more.
TEST(PipelineRecipeTest, EndsAsLayersTakeALayerOffTheEndChunks) {
  const Recipe four = recipe_with("pipeline_parallel_size: 4 pipeline_ends_as_layers: true");
  ASSERT_TRUE(validate_recipe(four).ok()) << validate_recipe(four);
  EXPECT_EQ(pipeline_chunk_layers(four), (std::vector<int>{2, 3, 3, 2}));
  const Recipe five = recipe_with("pipeline_parallel_size: 5 pipeline_ends_as_layers: true");
  ASSERT_TRUE(validate_recipe(five).ok()) << validate_recipe(five);
  EXPECT_EQ(pipeline_chunk_layers(five), (std::vector<int>{2, 3, 2, 2, 1}));
  // One chunk holds the whole model, embedding and head alike.
  EXPECT_EQ(pipeline_chunk_layers(recipe_with("pipeline_ends_as_layers: true")),
            (std::vector<int>{10}));
  // The tightest split the flag allows: 6 stages over 10 layers, 2 slots each.
  EXPECT_EQ(pipeline_chunk_layers(recipe_with(
                "pipeline_parallel_size: 6 pipeline_ends_as_layers: true")),
            (std::vector<int>{1, 2, 2, 2, 2, 1}));
}

TEST(PipelineRecipeTest, RefusesInOneLineNamingTheField) {
  const std::vector<testing::ParallelRefusal> cases = {
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
      {"pipeline_parallel_size: 2 pipeline_layers: [5, 5] pipeline_ends_as_layers: true",
       "parallel.pipeline_ends_as_layers weighs the even split; parallel.pipeline_layers lists "
       "the split itself: set one of them"},
      {"pipeline_parallel_size: 7 pipeline_ends_as_layers: true",
       "parallel.pipeline_ends_as_layers needs model.num_layers + 2 (12) >= 2 x the chunks (14)"},
  };
  testing::expect_parallel_refusals("pipeline", /*num_layers=*/10, cases);
  Recipe tied = recipe_with("pipeline_parallel_size: 2");
  tied.mutable_model()->set_tie_embeddings(true);
  EXPECT_NE(std::string(validate_recipe(tied).message())
                .find("model.tie_embeddings needs parallel.pipeline_parallel_size 1"),
            std::string::npos);
}

}  // namespace
}  // namespace switchyard::config
