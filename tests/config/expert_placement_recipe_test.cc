// parallel.expert_placement: a permutation of the experts, set in a recipe or with
// --set as comma-separated integers, and each way it can be wrong refused in one line.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config/recipe.h"

namespace switchyard::config {
namespace {

constexpr char kRecipe[] = R"pb(
  name: "placement"
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 moe_layer_interval: 1 }
  moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 128 }
  optimizer { lr: 1e-3 }
  train { global_batch_size: 8 micro_batch_size: 2 seq_len: 32 steps: 10 }
  data { corpus: "corpus.txt" }
)pb";

Recipe recipe_with(const std::string& parallel) {
  absl::StatusOr<Recipe> recipe =
      parse_recipe(absl::StrCat(kRecipe, " parallel { ", parallel, " }"), "placement");
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *recipe : Recipe();
}

TEST(ExpertPlacementRecipeTest, APermutationOverExpertParallelRanksIsValid) {
  EXPECT_TRUE(validate_recipe(recipe_with("expert_parallel_size: 2")).ok());
  EXPECT_TRUE(
      validate_recipe(recipe_with("expert_parallel_size: 2 expert_placement: [2, 0, 3, 1]")).ok());
}

TEST(ExpertPlacementRecipeTest, SetTakesCommaSeparatedIntegers) {
  Recipe recipe = recipe_with("expert_parallel_size: 2 expert_placement: [0, 1, 2, 3]");
  ASSERT_TRUE(apply_override(recipe, "parallel.expert_placement=3, 1,0,2").ok());
  EXPECT_EQ(std::vector<int>(recipe.parallel().expert_placement().begin(),
                             recipe.parallel().expert_placement().end()),
            (std::vector<int>{3, 1, 0, 2}));
  const absl::Status bad = apply_override(recipe, "parallel.expert_placement=3,one");
  EXPECT_NE(std::string(bad.message())
                .find("parallel.expert_placement takes comma-separated integers; \"one\" is "
                      "not one"),
            std::string::npos)
      << bad;
}

TEST(ExpertPlacementRecipeTest, RefusesInOneLineNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"expert_parallel_size: 2 expert_placement: [0, 1, 2]",
       "parallel.expert_placement has 3 entries; it must list each of the moe.num_experts (4) "
       "experts once"},
      {"expert_parallel_size: 2 expert_placement: [0, 1, 2, 3, 0]",
       "parallel.expert_placement has 5 entries"},
      {"expert_parallel_size: 2 expert_placement: [0, 1, -1, 3]",
       "parallel.expert_placement[2] (-1) is not an expert: it must be in [0, 4)"},
      {"expert_parallel_size: 2 expert_placement: [0, 1, 2, 2147483647]",
       "parallel.expert_placement[3] (2147483647) is not an expert"},
      {"expert_parallel_size: 2 expert_placement: [3, 1, 3, 0]",
       "parallel.expert_placement[2] (3) lists an expert twice: it must be a permutation"},
      {"expert_placement: [1, 0, 2, 3]",
       "parallel.expert_placement places experts over expert-parallel ranks: it needs "
       "parallel.expert_parallel_size > 1"},
  };
  for (const auto& [parallel, message] : cases) {
    SCOPED_TRACE(parallel);
    const absl::Status status = validate_recipe(recipe_with(parallel));
    ASSERT_FALSE(status.ok());
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << status;
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace switchyard::config
