// The sigmoid router's, expert choice's and forced balance's recipe fields: defaults, and one line naming
// the field for every invalid combination.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/config/recipe.h"

namespace switchyard::config {
namespace {

constexpr char kSigmoidRecipe[] = R"pb(
  name: "sigmoid"
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 }
  moe { num_experts: 8 top_k: 2 gating: SIGMOID_TOPK expert_ffn_hidden_size: 128 }
  optimizer { lr: 1e-3 }
  train { global_batch_size: 8 seq_len: 32 steps: 100 }
  data { corpus: "corpus.txt" }
)pb";

absl::StatusOr<Recipe> load_with(const std::vector<std::string>& overrides) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "moe_routing_validation.textproto";
  std::ofstream(path) << kSigmoidRecipe;
  return load_recipe(path.string(), overrides);
}

TEST(MoeRoutingRecipe, SigmoidDefaults) {
  const absl::StatusOr<Recipe> recipe = load_with({});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->moe().routed_scaling_factor(), 1.0f);
  EXPECT_EQ(recipe->moe().num_groups(), 1);
  EXPECT_EQ(recipe->moe().top_groups(), 1);
  EXPECT_FALSE(recipe->moe().norm_topk_prob());
  const absl::StatusOr<Recipe> grouped = load_with({"moe.num_groups=4"});
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(grouped->moe().top_groups(), 4);  // all groups
  EXPECT_TRUE(load_with({"moe.num_groups=4", "moe.top_groups=1", "moe.bias_update_rate=1e-3",
                         "moe.norm_topk_prob=true", "moe.routed_scaling_factor=2.5"})
                  .ok());
  EXPECT_TRUE(load_with({"moe.gating=TOPK_SOFTMAX", "moe.router_force_balance=true"}).ok());
}

struct Case {
  std::vector<std::string> overrides;
  std::string expected;
};

void PrintTo(const Case& c, std::ostream* os) { *os << absl::StrJoin(c.overrides, " "); }

class MoeRoutingRefusal : public ::testing::TestWithParam<Case> {};

TEST_P(MoeRoutingRefusal, NamesTheField) {
  const absl::Status status = load_with(GetParam().overrides).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(GetParam().expected), absl::string_view::npos)
      << status.message();
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Hostile, MoeRoutingRefusal,
    ::testing::Values(
        Case{{"moe.num_groups=3"}, "moe.num_groups (3) must divide moe.num_experts (8)"},
        Case{{"moe.num_groups=-2"}, "moe.num_groups (-2) must be > 0"},
        Case{{"moe.num_experts=128", "moe.num_groups=128"}, "moe.num_groups (128) must be <= 64"},
        Case{{"moe.num_groups=4", "moe.top_groups=5"},
             "moe.top_groups (5) must be in [1, moe.num_groups (4)]"},
        Case{{"moe.num_groups=4", "moe.top_groups=-1"}, "moe.top_groups (-1) must be in [1"},
        Case{{"moe.num_groups=8", "moe.top_groups=1"},
             "moe.top_k (2) must be <= the 1 experts of moe.top_groups (1) groups"},
        Case{{"moe.bias_update_rate=-0.1"}, "moe.bias_update_rate (-0.1) must be >= 0"},
        Case{{"moe.bias_update_rate=nan"}, "moe.bias_update_rate: nan is not a finite number"},
        Case{{"moe.routed_scaling_factor=-1"}, "moe.routed_scaling_factor (-1) must be > 0"},
        Case{{"moe.routed_scaling_factor=inf"},
             "moe.routed_scaling_factor: inf is not a finite number"},
        Case{{"moe.aux_loss_coef=0.01"}, "moe.aux_loss_coef (0.01) must be 0 with moe.gating "
                                         "SIGMOID_TOPK"},
        Case{{"moe.gating=TOPK_SOFTMAX", "moe.bias_update_rate=0.01"},
             "moe.bias_update_rate needs moe.gating SIGMOID_TOPK (moe.gating is TOPK_SOFTMAX)"},
        Case{{"moe.gating=SOFTMAX_TOPK", "moe.num_groups=2"},
             "moe.num_groups needs moe.gating SIGMOID_TOPK"},
        Case{{"moe.gating=GSHARD_TOP2", "moe.norm_topk_prob=true"},
             "moe.norm_topk_prob needs moe.gating SIGMOID_TOPK"},
        Case{{"moe.gating=TOPK_SOFTMAX", "moe.routed_scaling_factor=2"},
             "moe.routed_scaling_factor needs moe.gating SIGMOID_TOPK"},
        Case{{"moe.gating=TOPK_SOFTMAX", "moe.top_groups=1"},
             "moe.top_groups needs moe.gating SIGMOID_TOPK"},
        Case{{"moe.gating=EXPERT_CHOICE", "parallel.tensor_parallel_size=2"},
             "parallel.tensor_parallel_size (2) must be 1 with moe.gating EXPERT_CHOICE"},
        Case{{"moe.gating=EXPERT_CHOICE", "moe.router_force_balance=true"},
             "moe.router_force_balance excludes moe.gating EXPERT_CHOICE"}));

}  // namespace
}  // namespace switchyard::config
