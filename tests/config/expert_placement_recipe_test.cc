// parallel.expert_placement: a permutation of the experts, set in a recipe or with
// --set as comma-separated integers, and each way it can be wrong refused in one line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "tests/config/parallel_recipe.h"

namespace switchyard::config {
namespace {

Recipe recipe_with(const std::string& parallel) {
  return testing::recipe_with_parallel("placement", /*num_layers=*/2, parallel);
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
  EXPECT_EQ(bad.message(), "parallel.expert_placement[1]: one is not an integer");
}

TEST(ExpertPlacementRecipeTest, RefusesInOneLineNamingTheField) {
  const std::vector<testing::ParallelRefusal> cases = {
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
  testing::expect_parallel_refusals("placement", /*num_layers=*/2, cases);
}

}  // namespace
}  // namespace switchyard::config
