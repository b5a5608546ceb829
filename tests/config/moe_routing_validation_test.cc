// The routing's recipe fields (the selection, the score function, the renormalisation, the
// sigmoid router's, expert choice's and forced balance's): defaults, one line naming the
// field for every invalid combination, and the new spelling of a routing written as before
// the score function and the renormalisation were settings of their own.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config/recipe.h"

namespace switchyard::config {
namespace {

constexpr char kSigmoidRecipe[] = R"pb(
  name: "sigmoid"
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 }
  moe { num_experts: 8 top_k: 2 gating: TOP_K score_function: SIGMOID expert_ffn_hidden_size: 128 }
  optimizer { lr: 1e-3 }
  train { global_batch_size: 8 seq_len: 32 steps: 100 }
  data { corpus: "corpus.txt" }
)pb";

absl::StatusOr<Recipe> load_text(const std::string& text,
                                 const std::vector<std::string>& overrides) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "moe_routing_validation.textproto";
  std::ofstream(path) << text;
  return load_recipe(path.string(), overrides);
}

absl::StatusOr<Recipe> load_with(const std::vector<std::string>& overrides) {
  return load_text(kSigmoidRecipe, overrides);
}

TEST(MoeRoutingRecipe, SigmoidDefaults) {
  const absl::StatusOr<Recipe> recipe = load_with({});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->moe().routed_scaling_factor(), 1.0f);
  EXPECT_EQ(recipe->moe().num_groups(), 1);
  EXPECT_EQ(recipe->moe().top_groups(), 1);
  EXPECT_TRUE(recipe->moe().has_renormalize());
  EXPECT_FALSE(recipe->moe().renormalize());
  const absl::StatusOr<Recipe> grouped = load_with({"moe.num_groups=4"});
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(grouped->moe().top_groups(), 4);  // all groups
  EXPECT_TRUE(load_with({"moe.num_groups=4", "moe.top_groups=1", "moe.bias_update_rate=1e-3",
                         "moe.renormalize=true", "moe.routed_scaling_factor=2.5"})
                  .ok());
  EXPECT_TRUE(load_with({"moe.score_function=SOFTMAX", "moe.router_force_balance=true"}).ok());
}

// Unset, each selection and score function renormalises as its gating did before the
// renormalisation was a setting: softmax top-k and GShard do, sigmoid top-k and expert
// choice do not; an unset score function is softmax.
TEST(MoeRoutingRecipe, RenormalizeDefaultsByGatingAndScoreFunction) {
  struct Expected {
    std::vector<std::string> overrides;
    ScoreFunction score_function;
    bool renormalize;
  };
  for (const Expected& e : std::vector<Expected>{
           {{"moe.score_function=SOFTMAX"}, SOFTMAX, true},
           {{"moe.score_function=SCORE_FUNCTION_UNSPECIFIED"}, SOFTMAX, true},
           {{}, SIGMOID, false},
           {{"moe.score_function=SOFTMAX", "moe.renormalize=false"}, SOFTMAX, false},
           {{"moe.score_function=SOFTMAX", "moe.gating=GSHARD_TOP2"}, SOFTMAX, true},
           {{"moe.score_function=SOFTMAX", "moe.gating=EXPERT_CHOICE"}, SOFTMAX, false}}) {
    const absl::StatusOr<Recipe> recipe = load_with(e.overrides);
    ASSERT_TRUE(recipe.ok()) << absl::StrJoin(e.overrides, " ") << ": " << recipe.status();
    EXPECT_EQ(recipe->moe().score_function(), e.score_function) << absl::StrJoin(e.overrides, " ");
    EXPECT_EQ(recipe->moe().renormalize(), e.renormalize) << absl::StrJoin(e.overrides, " ");
  }
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
        Case{{"moe.aux_loss_coef=0.01"}, "moe.aux_loss_coef (0.01) must be 0 with "
                                         "moe.score_function SIGMOID"},
        Case{{"moe.score_function=SOFTMAX", "moe.bias_update_rate=0.01"},
             "moe.bias_update_rate needs moe.score_function SIGMOID (moe.score_function is "
             "SOFTMAX)"},
        Case{{"moe.score_function=SOFTMAX", "moe.renormalize=false", "moe.num_groups=2"},
             "moe.num_groups needs moe.score_function SIGMOID"},
        Case{{"moe.score_function=SOFTMAX", "moe.routed_scaling_factor=2"},
             "moe.routed_scaling_factor needs moe.score_function SIGMOID"},
        Case{{"moe.score_function=SOFTMAX", "moe.top_groups=1"},
             "moe.top_groups needs moe.score_function SIGMOID"},
        Case{{"moe.gating=GSHARD_TOP2"},
             "moe.score_function SIGMOID needs moe.gating TOP_K: GSHARD_TOP2 scores by SOFTMAX"},
        Case{{"moe.gating=EXPERT_CHOICE"},
             "moe.score_function SIGMOID needs moe.gating TOP_K: EXPERT_CHOICE scores by "
             "SOFTMAX"},
        Case{{"moe.gating=GSHARD_TOP2", "moe.score_function=SOFTMAX", "moe.renormalize=false"},
             "moe.renormalize false does not apply to moe.gating GSHARD_TOP2: it always "
             "renormalises its two weights (leave moe.renormalize unset)"},
        Case{{"moe.gating=EXPERT_CHOICE", "moe.score_function=SOFTMAX", "moe.renormalize=true"},
             "moe.renormalize true does not apply to moe.gating EXPERT_CHOICE: it weights a "
             "token by its probabilities alone"},
        Case{{"moe.gating=EXPERT_CHOICE", "moe.score_function=SOFTMAX",
              "parallel.tensor_parallel_size=2"},
             "parallel.tensor_parallel_size (2) must be 1 with moe.gating EXPERT_CHOICE"},
        Case{{"moe.gating=EXPERT_CHOICE", "moe.score_function=SOFTMAX",
              "moe.router_force_balance=true"},
             "moe.router_force_balance excludes moe.gating EXPERT_CHOICE"}));

// The spellings before the split, by --set: refused in one line that gives the new one.
INSTANTIATE_TEST_SUITE_P(
    LegacySpelling, MoeRoutingRefusal,
    ::testing::Values(
        Case{{"moe.gating=TOPK_SOFTMAX"},
             "override \"moe.gating=TOPK_SOFTMAX\": moe.gating: TOPK_SOFTMAX is now moe.gating: "
             "TOP_K with moe.score_function: SOFTMAX and moe.renormalize: true"},
        Case{{"moe.gating= SOFTMAX_TOPK"},
             "moe.gating: SOFTMAX_TOPK is now moe.gating: TOP_K with moe.score_function: "
             "SOFTMAX and moe.renormalize: false"},
        Case{{"moe.gating=SIGMOID_TOPK"},
             "moe.gating: SIGMOID_TOPK is now moe.gating: TOP_K with moe.score_function: "
             "SIGMOID (and moe.norm_topk_prob is now moe.renormalize)"},
        Case{{"moe.norm_topk_prob=true"},
             "override \"moe.norm_topk_prob=true\": moe.norm_topk_prob is now moe.renormalize"},
        Case{{"moe.norm_topk_prob=false"}, "moe.norm_topk_prob is now moe.renormalize"}));

// The same spellings in a recipe file: the file's line and column, and the new spelling.
TEST(MoeRoutingRecipe, RefusesTheLegacySpellingInAFile) {
  struct Legacy {
    std::string moe;
    std::string expected;
  };
  for (const Legacy& legacy : std::vector<Legacy>{
           {"gating: TOPK_SOFTMAX",
            ":3:41: moe.gating: TOPK_SOFTMAX is now moe.gating: TOP_K with moe.score_function: "
            "SOFTMAX and moe.renormalize: true"},
           {"gating: SOFTMAX_TOPK",
            ":3:41: moe.gating: SOFTMAX_TOPK is now moe.gating: TOP_K with moe.score_function: "
            "SOFTMAX and moe.renormalize: false"},
           {"gating: SIGMOID_TOPK norm_topk_prob: true",
            ":3:41: moe.gating: SIGMOID_TOPK is now moe.gating: TOP_K with "
            "moe.score_function: SIGMOID (and moe.norm_topk_prob is now moe.renormalize)"},
           {"gating: TOP_K score_function: SIGMOID norm_topk_prob: true",
            ":3:71: moe.norm_topk_prob is now moe.renormalize (and moe.gating: SIGMOID_TOPK is "
            "now moe.gating: TOP_K with moe.score_function: SIGMOID)"}}) {
    const std::string text = absl::StrCat(R"pb(
  name: "legacy"
  moe { num_experts: 8 top_k: 2 )pb", legacy.moe, R"pb( expert_ffn_hidden_size: 128 }
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 }
)pb");
    const absl::Status status = load_text(text, {}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << legacy.moe;
    EXPECT_TRUE(absl::EndsWith(status.message(), legacy.expected)) << status.message();
    EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status.message();
  }
}

// A checkpoint written before the split holds the old gatings by number and
// moe.norm_topk_prob as field 12: read, they become the new settings, filled as a recipe
// that spells them anew is, so that resuming compares equal.
TEST(MoeRoutingRecipe, UpgradesTheLegacyRoutingOfABinaryRecipe) {
  struct Legacy {
    int gating;
    bool norm_topk_prob;
    std::vector<std::string> now;
  };
  for (const Legacy& legacy : std::vector<Legacy>{
           {1, false, {"moe.score_function=SOFTMAX", "moe.renormalize=true"}},
           {2, false, {"moe.score_function=SOFTMAX", "moe.renormalize=false"}},
           {4, false, {}},
           {4, true, {"moe.renormalize=true"}},
           {3, false, {"moe.gating=GSHARD_TOP2", "moe.score_function=SOFTMAX"}},
           {5, false, {"moe.gating=EXPERT_CHOICE", "moe.score_function=SOFTMAX"}}}) {
    const absl::StatusOr<Recipe> expected = load_with(legacy.now);
    ASSERT_TRUE(expected.ok()) << expected.status();
    // The old bytes: the recipe less its new settings, the old ones appended (a later
    // occurrence of a field wins when protobuf parses).
    MoeConfig old = expected->moe();
    old.clear_gating();
    old.clear_score_function();
    old.clear_renormalize();
    std::string bytes = old.SerializeAsString();
    bytes += static_cast<char>(3 << 3);  // field 3 (gating), varint
    bytes += static_cast<char>(legacy.gating);
    if (legacy.norm_topk_prob) bytes += std::string{static_cast<char>(12 << 3), 1};
    MoeConfig read;
    ASSERT_TRUE(read.ParseFromString(bytes));
    upgrade_legacy_routing(read);
    EXPECT_EQ(read.SerializeAsString(), expected->moe().SerializeAsString())
        << legacy.gating << ": " << read.ShortDebugString() << " vs "
        << expected->moe().ShortDebugString();
    EXPECT_TRUE(validate_recipe([&] {
                  Recipe r = *expected;
                  *r.mutable_moe() = read;
                  return r;
                }())
                    .ok());
  }
}

// A weights directory's recipe.textproto, printed by a run before the split, is read in
// the new spelling (convert, sample, bench balance and train.init_from read those), while
// a recipe a person writes with the old names is still refused.
TEST(MoeRoutingRecipe, ReadsASavedRecipeWrittenBeforeTheSplit) {
  struct Legacy {
    std::string moe;
    std::vector<std::string> now;
  };
  const auto saved = [](const std::string& moe_lines) {
    return absl::StrCat("name: \"saved\"\nmodel {\n  vocab_size: 512\n  hidden_size: 64\n",
                        "  num_layers: 2\n  num_heads: 4\n}\nmoe {\n  num_experts: 8\n",
                        "  top_k: 2\n", moe_lines, "  expert_ffn_hidden_size: 128\n}\n",
                        "optimizer {\n  lr: 0.001\n}\ntrain {\n  global_batch_size: 8\n",
                        "  seq_len: 32\n  steps: 100\n}\ndata {\n  corpus: \"corpus.txt\"\n}\n");
  };
  for (const Legacy& legacy : std::vector<Legacy>{
           {"  gating: TOPK_SOFTMAX\n",
            {"moe.score_function=SOFTMAX", "moe.renormalize=true"}},
           {"  gating: SOFTMAX_TOPK\n",
            {"moe.score_function=SOFTMAX", "moe.renormalize=false"}},
           {"  gating: SIGMOID_TOPK\n", {}},
           {"  gating: SIGMOID_TOPK\n  norm_topk_prob: true\n", {"moe.renormalize=true"}}}) {
    const std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / "saved_recipe.textproto";
    std::ofstream(path) << saved(legacy.moe);
    const absl::StatusOr<Recipe> read = load_saved_recipe(path.string());
    ASSERT_TRUE(read.ok()) << read.status();
    const absl::StatusOr<Recipe> expected = load_with(legacy.now);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(read->moe().SerializeAsString(), expected->moe().SerializeAsString())
        << legacy.moe << read->moe().ShortDebugString();
    EXPECT_FALSE(load_recipe(path.string(), {}).ok()) << legacy.moe;
  }
  const std::string current = saved("  gating: TOP_K\n  score_function: SIGMOID\n");
  EXPECT_EQ(upgrade_legacy_routing_text(current), current);
}

}  // namespace
}  // namespace switchyard::config
