#include "core/config/recipe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace switchyard::config {
namespace {

namespace fs = std::filesystem;

// Plain gtest (the test links no gmock): whether `part` occurs in `text`.
::testing::AssertionResult contains(absl::string_view text, absl::string_view part) {
  if (text.find(part) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// The repository root: the first ancestor of the working directory holding the
// shipped recipes, else the one two levels above this file (absolute under CMake).
fs::path repo_root() {
  for (fs::path dir = fs::current_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "recipes" / "tiny.textproto")) return dir;
    if (dir == dir.parent_path()) break;
  }
  return fs::path(__FILE__).parent_path().parent_path().parent_path();
}

// A small valid recipe that leans on defaults; each validation case breaks one thing.
constexpr char kValidRecipe[] = R"pb(
  name: "test"
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 moe_layer_interval: 1 }
  moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 128 }
  optimizer { lr: 1e-3 warmup_steps: 10 }
  train { global_batch_size: 8 micro_batch_size: 4 seq_len: 32 steps: 100 }
  data { corpus: "corpus.txt" }
)pb";

// kValidRecipe as a file, for load_recipe.
std::string valid_recipe_path() {
  const fs::path path = fs::path(::testing::TempDir()) / "recipe_test_valid.textproto";
  std::ofstream(path) << kValidRecipe;
  return path.string();
}

Recipe valid_recipe() {
  absl::StatusOr<Recipe> recipe = parse_recipe(kValidRecipe, "valid");
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

// Loads the valid recipe with the overrides applied (defaults filled after them).
absl::Status validate_with(const std::vector<std::string>& overrides) {
  return load_recipe(valid_recipe_path(), overrides).status();
}

TEST(RecipeTest, EveryShippedRecipeLoadsAndValidates) {
  const fs::path recipes = repo_root() / "recipes";
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(recipes)) {
    if (entry.path().extension() != ".textproto") continue;
    absl::StatusOr<Recipe> recipe = load_recipe(entry.path().string(), {});
    ASSERT_TRUE(recipe.ok()) << recipe.status();
    EXPECT_EQ(recipe->name(), entry.path().stem().string());
    EXPECT_FALSE(summarize_recipe(*recipe).empty());
    names.push_back(recipe->name());
  }
  // More recipes may be added; these five must stay.
  for (const char* expected :
       {"tiny", "mixtral-8x7b", "switch-base-8", "olmoe-1b-7b", "qwen-moe-a2.7b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
}

TEST(RecipeTest, ShippedShapes) {
  const fs::path recipes = repo_root() / "recipes";
  absl::StatusOr<Recipe> tiny = load_recipe((recipes / "tiny.textproto").string(), {});
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->model().vocab_size(), 1024);
  EXPECT_EQ(effective_head_dim(tiny->model()), 32);
  EXPECT_EQ(tiny->model().max_position_embeddings(), 128);
  for (int layer = 0; layer < 4; ++layer) EXPECT_TRUE(is_moe_layer(*tiny, layer));

  absl::StatusOr<Recipe> mixtral = load_recipe((recipes / "mixtral-8x7b.textproto").string(), {});
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->model().head_dim(), 128);
  EXPECT_EQ(mixtral->model().num_kv_heads(), 8);
  EXPECT_EQ(mixtral->moe().expert_ffn_hidden_size(), 14336);

  absl::StatusOr<Recipe> switch_base =
      load_recipe((recipes / "switch-base-8.textproto").string(), {});
  ASSERT_TRUE(switch_base.ok()) << switch_base.status();
  EXPECT_FALSE(is_moe_layer(*switch_base, 0));
  EXPECT_TRUE(is_moe_layer(*switch_base, 1));
  EXPECT_FALSE(is_moe_layer(*switch_base, 10));
  EXPECT_TRUE(is_moe_layer(*switch_base, 11));
  EXPECT_EQ(switch_base->moe().gating(), TOP_K);
  EXPECT_EQ(switch_base->moe().score_function(), SOFTMAX);
  EXPECT_FALSE(switch_base->moe().renormalize());

  absl::StatusOr<Recipe> qwen = load_recipe((recipes / "qwen-moe-a2.7b.textproto").string(), {});
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->moe().num_shared_experts(), 1);
  EXPECT_TRUE(qwen->moe().shared_expert_gate());
}

TEST(RecipeTest, DefaultsAreFilled) {
  const Recipe recipe = valid_recipe();
  EXPECT_EQ(recipe.model().num_kv_heads(), 4);
  EXPECT_EQ(recipe.model().head_dim(), 16);
  EXPECT_FLOAT_EQ(recipe.model().rope_theta(), 10000.0f);
  EXPECT_FLOAT_EQ(recipe.model().norm_eps(), 1e-5f);
  EXPECT_FLOAT_EQ(recipe.model().init_std(), 0.02f);
  EXPECT_EQ(recipe.model().max_position_embeddings(), 32);
  EXPECT_EQ(recipe.moe().gating(), TOP_K);
  EXPECT_EQ(recipe.moe().score_function(), SOFTMAX);
  EXPECT_TRUE(recipe.moe().renormalize());
  EXPECT_EQ(recipe.parallel().tensor_parallel_size(), 1);
  EXPECT_EQ(recipe.parallel().expert_parallel_size(), 1);
  EXPECT_FLOAT_EQ(recipe.optimizer().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(recipe.optimizer().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(recipe.optimizer().eps(), 1e-8f);
  EXPECT_FLOAT_EQ(recipe.optimizer().weight_decay(), 0.1f);
  EXPECT_FLOAT_EQ(recipe.optimizer().min_lr(), 0.0f);
  EXPECT_EQ(recipe.optimizer().decay(), COSINE);
  EXPECT_EQ(recipe.train().micro_batch_size(), 4);
  EXPECT_EQ(recipe.train().log_interval(), 10);
  EXPECT_EQ(recipe.train().eval_tokens(), int64_t{1} << 20);
  EXPECT_FLOAT_EQ(recipe.data().val_fraction(), 0.1f);
  EXPECT_EQ(recipe.checkpoint().dir(), "checkpoints");
  EXPECT_EQ(recipe.checkpoint().keep(), 3);
  EXPECT_TRUE(validate_recipe(recipe).ok()) << validate_recipe(recipe);
}

TEST(RecipeTest, DeprecatedEvalBatchesBecomeEvalTokens) {
  absl::StatusOr<Recipe> recipe = load_recipe(valid_recipe_path(), {"train.eval_batches=3"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->train().eval_tokens(), 3 * 4 * 32);  // micro-batches of 4 windows of 32
  EXPECT_EQ(recipe->train().eval_batches(), 0);
}

TEST(RecipeTest, MicroBatchDefaultsToGlobalBatch) {
  absl::StatusOr<Recipe> recipe = parse_recipe("train { global_batch_size: 12 }", "x");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->train().micro_batch_size(), 12);
  EXPECT_EQ(recipe->model().moe_layer_interval(), 0);
}

TEST(RecipeTest, ExplicitZerosAreKeptForOptionalFields) {
  absl::StatusOr<Recipe> recipe = parse_recipe(
      "optimizer { beta1: 0 weight_decay: 0 } data { corpus: \"c\" val_fraction: 0 } "
      "checkpoint { keep: 0 }",
      "x");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->optimizer().beta1(), 0.0f);
  EXPECT_FLOAT_EQ(recipe->optimizer().beta2(), 0.95f);
  EXPECT_EQ(recipe->optimizer().weight_decay(), 0.0f);
  EXPECT_EQ(recipe->data().val_fraction(), 0.0f);
  EXPECT_EQ(recipe->checkpoint().keep(), 0);
}

TEST(RecipeTest, OverridesSetEveryScalarKind) {
  Recipe recipe = valid_recipe();
  ASSERT_TRUE(apply_override(recipe, "train.steps=200").ok());
  ASSERT_TRUE(apply_override(recipe, "model.num_heads=8").ok());
  ASSERT_TRUE(apply_override(recipe, "optimizer.lr=2.5e-4").ok());
  ASSERT_TRUE(apply_override(recipe, "model.tie_embeddings=true").ok());
  ASSERT_TRUE(apply_override(recipe, "moe.score_function=SIGMOID").ok());
  ASSERT_TRUE(apply_override(recipe, "data.corpus=foo bar.txt").ok());
  ASSERT_TRUE(apply_override(recipe, "train.seed=18446744073709551615").ok());
  ASSERT_TRUE(apply_override(recipe, "optimizer.weight_decay=0").ok());
  EXPECT_EQ(recipe.train().steps(), 200);
  EXPECT_EQ(recipe.model().num_heads(), 8);
  EXPECT_FLOAT_EQ(recipe.optimizer().lr(), 2.5e-4f);
  EXPECT_TRUE(recipe.model().tie_embeddings());
  EXPECT_EQ(recipe.moe().score_function(), SIGMOID);
  EXPECT_EQ(recipe.data().corpus(), "foo bar.txt");
  EXPECT_EQ(recipe.train().seed(), 18446744073709551615ull);
  EXPECT_EQ(recipe.optimizer().weight_decay(), 0.0f);
  fill_defaults(recipe);
  EXPECT_EQ(recipe.optimizer().weight_decay(), 0.0f);
}

TEST(RecipeTest, DerivedDefaultsFollowOverrides) {
  const fs::path tiny = repo_root() / "recipes" / "tiny.textproto";
  absl::StatusOr<Recipe> recipe =
      load_recipe(tiny.string(), {"model.hidden_size=256", "train.seq_len=64"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model().head_dim(), 64);
  EXPECT_EQ(recipe->model().max_position_embeddings(), 64);

  recipe = load_recipe(tiny.string(), {"model.moe_layer_interval=0", "model.ffn_hidden_size=512"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_FALSE(is_moe_layer(*recipe, 3));
}

TEST(RecipeTest, OverrideErrors) {
  Recipe recipe = valid_recipe();
  absl::Status status = apply_override(recipe, "train.steps");
  EXPECT_TRUE(contains(status.message(), "field.path=value"));
  status = apply_override(recipe, "=5");
  EXPECT_TRUE(contains(status.message(), "field.path=value"));

  status = apply_override(recipe, "train.stesp=5");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(status.message(), "\"train.stesp\""));
  EXPECT_TRUE(contains(status.message(), "global_batch_size, micro_batch_size, seq_len, steps"));
  status = apply_override(recipe, "trian.steps=5");
  EXPECT_TRUE(contains(status.message(), "\"trian.steps\""));
  EXPECT_TRUE(contains(status.message(), "model, moe"));

  status = apply_override(recipe, "train.steps=many");
  EXPECT_EQ(status.message(), "train.steps: many is not an integer");
  status = apply_override(recipe, "model.num_heads=99999999999");
  EXPECT_EQ(status.message(),
            "model.num_heads: 99999999999 is out of range [-2147483648, 2147483647]");
  status = apply_override(recipe, "optimizer.lr=fast");
  EXPECT_EQ(status.message(), "optimizer.lr: fast is not a number");
  status = apply_override(recipe, "model.tie_embeddings=maybe");
  EXPECT_TRUE(contains(status.message(), "model.tie_embeddings"));
  status = apply_override(recipe, "moe.gating=TOP3");
  EXPECT_TRUE(contains(status.message(), "GSHARD_TOP2"));
  status = apply_override(recipe, "train.seed=-1");
  EXPECT_EQ(status.message(), "train.seed: -1 must be a non-negative integer");

  status = apply_override(recipe, "train=5");
  EXPECT_TRUE(contains(status.message(), "train is a message, not a scalar"));
  status = apply_override(recipe, "train.steps.more=5");
  EXPECT_TRUE(contains(status.message(), "train.steps is a scalar field"));
  EXPECT_EQ(recipe.train().steps(), 100);
}

TEST(RecipeTest, ParseErrorsCarryLineAndColumn) {
  absl::StatusOr<Recipe> recipe =
      parse_recipe("model {\n  vocab_size: 256\n  hiden_size: 128\n}\n", "recipes/x.textproto");
  ASSERT_FALSE(recipe.ok());
  EXPECT_EQ(recipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(recipe.status().message(),
                       "recipes/x.textproto:3:3: unknown field \"hiden_size\" in "
                       "switchyard.config.ModelConfig (valid fields: vocab_size, hidden_size"));

  recipe = parse_recipe("train {\n  steps: \"many\"\n}\n", "r.textproto");
  ASSERT_FALSE(recipe.ok());
  EXPECT_TRUE(contains(recipe.status().message(), "r.textproto:2:10: "));

  recipe = parse_recipe("moe { gating: TOP3 }", "r.textproto");
  ASSERT_FALSE(recipe.ok());
  EXPECT_TRUE(contains(recipe.status().message(), "r.textproto:1:"));
  EXPECT_TRUE(contains(recipe.status().message(), "TOP3"));

  recipe = parse_recipe("train { steps: 1", "r.textproto");
  ASSERT_FALSE(recipe.ok());
  EXPECT_TRUE(contains(recipe.status().message(), "r.textproto:1:"));
}

TEST(RecipeTest, LoadErrorsNameTheFile) {
  absl::StatusOr<Recipe> recipe = load_recipe("/nonexistent/recipe.textproto", {});
  EXPECT_EQ(recipe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(recipe.status().message(), "/nonexistent/recipe.textproto"));

  const fs::path tiny = repo_root() / "recipes" / "tiny.textproto";
  recipe = load_recipe(tiny.string(), {"moe.top_k=9"});
  ASSERT_FALSE(recipe.ok());
  EXPECT_TRUE(contains(recipe.status().message(), "tiny.textproto: moe.top_k (9)"));
  recipe = load_recipe(tiny.string(), {"moe.topk=1"});
  ASSERT_FALSE(recipe.ok());
  EXPECT_TRUE(contains(recipe.status().message(), "moe.topk"));
}

struct ValidationCase {
  std::vector<std::string> overrides;
  std::string expected;
};

void PrintTo(const ValidationCase& test_case, std::ostream* os) {
  *os << absl::StrJoin(test_case.overrides, " ");
}

class ValidationTest : public ::testing::TestWithParam<ValidationCase> {};

TEST(RecipeTest, ListOverrideReplacesARepeatedStringField) {
  Recipe recipe;
  recipe.mutable_train()->add_freeze("lm_head");
  ASSERT_TRUE(apply_override(recipe, "train.freeze=router, attention,").ok());
  EXPECT_EQ(std::vector<std::string>(recipe.train().freeze().begin(), recipe.train().freeze().end()),
            (std::vector<std::string>{"router", "attention"}));
  EXPECT_FALSE(apply_override(recipe, "train.freeze.x=1").ok());
}

TEST_P(ValidationTest, ErrorNamesTheField) {
  absl::Status status = validate_with(GetParam().overrides);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(status.message(), GetParam().expected));
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos);
}

INSTANTIATE_TEST_SUITE_P(
    RecipeTest, ValidationTest,
    ::testing::Values(
        ValidationCase{{"model.vocab_size=0"}, "model.vocab_size (0) must be > 0"},
        ValidationCase{{"model.vocab_size=100"}, "model.vocab_size (100) must be >= 300"},
        ValidationCase{{"model.hidden_size=-8"}, "model.hidden_size (-8) must be > 0"},
        ValidationCase{{"model.num_layers=0"}, "model.num_layers (0) must be > 0"},
        ValidationCase{{"model.num_heads=0"}, "model.num_heads (0) must be > 0"},
        ValidationCase{{"model.hidden_size=100", "model.num_heads=3"},
                       "model.hidden_size (100) must be divisible by model.num_heads (3)"},
        ValidationCase{{"model.num_kv_heads=3"},
                       "model.num_heads (4) must be divisible by model.num_kv_heads (3)"},
        ValidationCase{{"model.hidden_size=12", "model.num_heads=4"},
                       "model.head_dim (3) must be even"},
        ValidationCase{{"model.head_dim=-2"}, "model.head_dim (-2) must be >= 0"},
        ValidationCase{{"model.head_dim=7"}, "model.head_dim (7) must be even"},
        ValidationCase{{"model.qk_norm=true", "model.qk_head_norm=true"},
                       "model.qk_norm and model.qk_head_norm are exclusive"},
        ValidationCase{{"model.rope_theta=-1"}, "model.rope_theta (-1) must be > 0"},
        ValidationCase{{"model.mtp_depth=-1"}, "model.mtp_depth (-1) must be >= 0"},
        ValidationCase{{"model.mtp_depth=9"}, "model.mtp_depth (9) must be <= 8"},
        ValidationCase{{"model.mtp_loss_coef=-0.5"}, "model.mtp_loss_coef (-0.5) must be >= 0"},
        ValidationCase{{"model.mtp_loss_coef=1001"}, "model.mtp_loss_coef (1001) must be <= 1000"},
        ValidationCase{{"model.mtp_depth=3", "train.seq_len=4"},
                       "model.mtp_depth (3) needs train.seq_len > mtp_depth + 1 (not 4)"},
        ValidationCase{{"model.mtp_depth=1", "parallel.pipeline_parallel_size=2"},
                       "model.mtp_depth needs parallel.pipeline_parallel_size 1 (not 2)"},
        ValidationCase{{"model.norm_eps=nan"}, "model.norm_eps: nan is not a finite number"},
        ValidationCase{{"model.rope_theta=inf"}, "model.rope_theta: inf is not a finite number"},
        ValidationCase{{"model.rope_scaling.factor=4"},
                       "model.rope_scaling.factor is set but model.rope_scaling.type is not YARN"},
        ValidationCase{{"model.rope_scaling.type=YARN",
                        "model.rope_scaling.original_max_position_embeddings=64"},
                       "model.rope_scaling.factor (0) must be > 0"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=-1"},
                       "model.rope_scaling.factor (-1) must be >= 0"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=nan"},
                       "model.rope_scaling.factor: nan is not a finite number"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=1e30"},
                       "model.rope_scaling.factor (1e+30) must be <= 65536"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=4",
                        "model.rope_scaling.mscale_all_dim=inf"},
                       "model.rope_scaling.mscale_all_dim: inf is not a finite number"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=4"},
                       "model.rope_scaling.original_max_position_embeddings (0) must be > 0"},
        ValidationCase{{"model.rope_scaling.type=YARN", "model.rope_scaling.factor=4",
                        "model.rope_scaling.original_max_position_embeddings=100000000"},
                       "model.rope_scaling.original_max_position_embeddings (100000000) must be "
                       "<= 16777216"},
        ValidationCase{{"model.vocab_size=2000000000"},
                       "model.vocab_size (2000000000) must be <= 16777216"},
        ValidationCase{{"model.hidden_size=131072"}, "model.hidden_size (131072) must be <= 65536"},
        ValidationCase{{"model.num_layers=100000"}, "model.num_layers (100000) must be <= 1024"},
        ValidationCase{{"model.head_dim=4096"}, "model.head_dim (4096) must be <= 1024"},
        ValidationCase{{"moe.num_experts=8192"}, "moe.num_experts (8192) must be <= 4096"},
        ValidationCase{{"moe.expert_ffn_hidden_size=1000000"},
                       "moe.expert_ffn_hidden_size (1000000) must be <= 262144"},
        ValidationCase{{"model.max_position_embeddings=100000000"},
                       "model.max_position_embeddings (100000000) must be <= 16777216"},
        ValidationCase{{"runtime.threads=1000000"}, "runtime.threads (1000000) must be <= 4096"},
        ValidationCase{{"optimizer.grad_clip=inf"}, "optimizer.grad_clip: inf is not a finite number"},
        ValidationCase{{"optimizer.router_lr_scale=-1"},
                       "optimizer.router_lr_scale (-1) must be >= 0 and finite"},
        ValidationCase{{"optimizer.router_lr_scale=nan"},
                       "optimizer.router_lr_scale: nan is not a finite number"},
        ValidationCase{{"optimizer.router_lr_scale=inf"},
                       "optimizer.router_lr_scale: inf is not a finite number"},
        ValidationCase{{"optimizer.router_lr_scale=1001"},
                       "optimizer.router_lr_scale (1001) must be <= 1000"},
        ValidationCase{{"model.max_position_embeddings=16"},
                       "train.seq_len (32) must be <= model.max_position_embeddings (16)"},
        ValidationCase{{"model.moe_layer_interval=2"}, "model.ffn_hidden_size must be > 0"},
        ValidationCase{{"model.first_dense_layers=1"}, "model.ffn_hidden_size must be > 0"},
        ValidationCase{{"moe.top_k=5"}, "moe.top_k (5) must be <= moe.num_experts (4)"},
        ValidationCase{{"moe.top_k=0"}, "moe.top_k (0) must be > 0"},
        ValidationCase{{"moe.num_experts=0"}, "moe.num_experts (0) must be > 0"},
        ValidationCase{{"moe.gating=GSHARD_TOP2", "moe.top_k=1"},
                       "moe.top_k (1) must be 2 with moe.gating GSHARD_TOP2"},
        ValidationCase{{"moe.expert_ffn_hidden_size=0"},
                       "moe.expert_ffn_hidden_size (0) must be > 0"},
        ValidationCase{{"moe.capacity_factor=-1"}, "moe.capacity_factor (-1) must be >= 0"},
        ValidationCase{{"moe.aux_loss_coef=-0.1"}, "moe.aux_loss_coef (-0.1) must be >= 0"},
        ValidationCase{{"moe.z_loss_coef=-0.1"}, "moe.z_loss_coef (-0.1) must be >= 0"},
        ValidationCase{{"moe.num_shared_experts=1"},
                       "moe.shared_expert_ffn_hidden_size (0) must be > 0"},
        ValidationCase{{"moe.shared_expert_gate=true"},
                       "moe.shared_expert_gate needs moe.num_shared_experts > 0"},
        ValidationCase{{"parallel.tensor_parallel_size=-1"},
                       "parallel.tensor_parallel_size (-1) must be > 0"},
        ValidationCase{{"parallel.expert_parallel_size=3"},
                       "moe.num_experts (4) must be divisible by parallel.expert_parallel_size"},
        ValidationCase{{"parallel.tensor_parallel_size=8"},
                       "model.num_heads (4) must be divisible by parallel.tensor_parallel_size"},
        ValidationCase{{"parallel.zero_stage=4"}, "parallel.zero_stage (4) must be 0, 1, 2 or 3"},
        ValidationCase{{"optimizer.lr=0"}, "optimizer.lr (0) must be > 0"},
        ValidationCase{{"optimizer.min_lr=1"}, "optimizer.min_lr (1) must be <= optimizer.lr"},
        ValidationCase{{"optimizer.beta1=1"}, "optimizer.beta1 (1) must be in [0, 1)"},
        ValidationCase{{"optimizer.beta2=-0.5"}, "optimizer.beta2 (-0.5) must be in [0, 1)"},
        ValidationCase{{"optimizer.eps=-1"}, "optimizer.eps (-1) must be > 0"},
        ValidationCase{{"optimizer.weight_decay=-1"}, "optimizer.weight_decay (-1) must be >= 0"},
        ValidationCase{{"optimizer.warmup_steps=101"},
                       "optimizer.warmup_steps (101) must be <= train.steps (100)"},
        ValidationCase{{"optimizer.grad_clip=-1"}, "optimizer.grad_clip (-1) must be >= 0"},
        ValidationCase{{"optimizer.muon.momentum=0.9"},
                       "optimizer.muon is set but optimizer.algorithm is ADAMW"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.momentum=1"},
                       "optimizer.muon.momentum (1) must be in [0, 1)"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.ns_steps=-1"},
                       "optimizer.muon.ns_steps (-1) must be > 0"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.ns_steps=101"},
                       "optimizer.muon.ns_steps (101) must be <= 100"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.update_rms=0"},
                       "optimizer.muon.update_rms (0) must be > 0"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.update_rms=101"},
                       "optimizer.muon.update_rms (101) must be <= 100"},
        ValidationCase{{"optimizer.algorithm=MUON", "optimizer.muon.eps=-1"},
                       "optimizer.muon.eps (-1) must be > 0"},
        ValidationCase{{"train.global_batch_size=10"},
                       "train.global_batch_size (10) must be divisible by train.micro_batch_size "
                       "(4)"},
        ValidationCase{{"runtime.batch_invariant=true", "train.global_batch_size=16385",
                        "train.micro_batch_size=1"},
                       "runtime.batch_invariant sums the gradients of at most 16384 "
                       "micro-batches a step; train.global_batch_size / "
                       "train.micro_batch_size is 16385"},
        ValidationCase{{"train.global_batch_size=0", "train.micro_batch_size=0"},
                       "train.global_batch_size (0) must be > 0"},
        ValidationCase{{"train.seq_len=0"}, "train.seq_len (0) must be > 0"},
        ValidationCase{{"train.steps=-1", "optimizer.warmup_steps=0"},
                       "train.steps (-1) must be >= 0"},
        ValidationCase{{"train.eval_interval=-5"}, "train.eval_interval (-5) must be >= 0"},
        ValidationCase{{"train.eval_tokens=-5"}, "train.eval_tokens (-5) must be > 0"},
        ValidationCase{{"train.eval_tokens=2000000000000"},
                       "train.eval_tokens (2000000000000) must be <= 1099511627776"},
        ValidationCase{{"train.eval_batches=2", "train.eval_tokens=64"},
                       "train.eval_batches (2) is replaced by train.eval_tokens"},
        ValidationCase{{"train.eval_batches=-1"},
                       "train.eval_batches (-1) is replaced by train.eval_tokens"},
        ValidationCase{{"train.eval_batches=9223372036854775807"},
                       "train.eval_batches (9223372036854775807) is replaced by train.eval_tokens"},
        ValidationCase{{"data.corpus="}, "exactly one of data.dataset and data.corpus"},
        ValidationCase{{"data.dataset=prepared"}, "exactly one of data.dataset and data.corpus"},
        ValidationCase{{"data.val_fraction=1"}, "data.val_fraction (1) must be in [0, 1)"},
        ValidationCase{{"data.val_fraction=0", "train.eval_interval=10"},
                       "train.eval_interval (10) needs data.val_fraction > 0"},
        ValidationCase{{"checkpoint.keep=-1"}, "checkpoint.keep (-1) must be >= 0"},
        ValidationCase{{"runtime.device=tpu"}, "runtime.device (\"tpu\") must be"},
        ValidationCase{{"runtime.threads=-2"}, "runtime.threads (-2) must be >= 0"},
        ValidationCase{{"runtime.max_logits_mb=-1"}, "runtime.max_logits_mb (-1) must be >= 0"},
        ValidationCase{{"runtime.precision=fp8"}, "runtime.precision (\"fp8\") must be"}));

TEST(RecipeTest, MuonDefaultsArePublishedOnes) {
  absl::StatusOr<Recipe> recipe = load_recipe(valid_recipe_path(), {"optimizer.algorithm=MUON"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const MuonConfig& muon = recipe->optimizer().muon();
  EXPECT_FLOAT_EQ(muon.momentum(), 0.95f);
  EXPECT_TRUE(muon.nesterov());
  EXPECT_EQ(muon.ns_steps(), 5);
  EXPECT_FLOAT_EQ(muon.ns_a(), 3.4445f);
  EXPECT_FLOAT_EQ(muon.ns_b(), -4.7750f);
  EXPECT_FLOAT_EQ(muon.ns_c(), 2.0315f);
  EXPECT_FLOAT_EQ(muon.update_rms(), 0.2f);
  EXPECT_FLOAT_EQ(muon.eps(), 1e-7f);
  // AdamW, the default, gets none of it.
  absl::StatusOr<Recipe> adamw = load_recipe(valid_recipe_path(), {});
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ(adamw->optimizer().algorithm(), ADAMW);
  EXPECT_FALSE(adamw->optimizer().has_muon());
}

TEST(RecipeTest, ExplicitHeadDimNeedNotMatchHidden) {
  EXPECT_TRUE(validate_with({"model.head_dim=32"}).ok());
  EXPECT_TRUE(validate_with({"model.hidden_size=100", "model.num_heads=3", "model.head_dim=32",
                             "model.num_kv_heads=1"})
                  .ok());
}

TEST(RecipeTest, RouterLrScaleTakesZeroToAThousandAndFreezeAnyZeroStage) {
  for (const char* scale : {"0", "0.1", "1000"})
    EXPECT_TRUE(validate_with({absl::StrCat("optimizer.router_lr_scale=", scale)}).ok()) << scale;
  for (const char* stage : {"2", "3"})
    EXPECT_TRUE(validate_with({"train.freeze=router,attention",
                               absl::StrCat("parallel.zero_stage=", stage)})
                    .ok())
        << stage;
}

TEST(RecipeTest, DenseBaselineNeedsNoMoeFields) {
  EXPECT_TRUE(validate_with({"model.moe_layer_interval=0", "moe.num_experts=0", "moe.top_k=0",
                             "model.ffn_hidden_size=256"})
                  .ok());
}

TEST(RecipeTest, MoeLayerPlacement) {
  Recipe recipe = valid_recipe();
  recipe.mutable_model()->set_num_layers(6);
  recipe.mutable_model()->set_moe_layer_interval(2);
  recipe.mutable_model()->set_first_dense_layers(2);
  std::vector<bool> moe;
  for (int layer = 0; layer < 6; ++layer) moe.push_back(is_moe_layer(recipe, layer));
  EXPECT_EQ(moe, (std::vector<bool>{false, false, false, true, false, true}));

  recipe.mutable_model()->clear_moe_layer_interval();
  recipe.mutable_model()->set_first_dense_layers(1);
  EXPECT_FALSE(is_moe_layer(recipe, 0));
  EXPECT_TRUE(is_moe_layer(recipe, 1));
}

TEST(RecipeTest, EffectiveHeads) {
  ModelConfig model;
  model.set_hidden_size(96);
  model.set_num_heads(6);
  EXPECT_EQ(effective_kv_heads(model), 6);
  EXPECT_EQ(effective_head_dim(model), 16);
  model.set_num_kv_heads(2);
  model.set_head_dim(64);
  EXPECT_EQ(effective_kv_heads(model), 2);
  EXPECT_EQ(effective_head_dim(model), 64);
}

TEST(RecipeTest, SummaryMentionsShape) {
  const std::string summary = summarize_recipe(valid_recipe());
  EXPECT_TRUE(contains(summary, "test: 2 layers (2 MoE), hidden 64"));
  EXPECT_TRUE(contains(summary, "4 experts top-2 TOP_K SOFTMAX renormalised"));
  EXPECT_TRUE(contains(summary, "100 steps x 8 seqs x 32 tokens"));
}

TEST(RecipeTest, QuickRunClampsWarmupAndWarnsOnce) {
  std::string warning = "unset";
  absl::StatusOr<Recipe> recipe = load_recipe(
      valid_recipe_path(),
      {"train.steps=5", "train.eval_interval=200", "checkpoint.interval_steps=100"}, &warning);
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->optimizer().warmup_steps(), 5);
  EXPECT_EQ(recipe->train().eval_interval(), 200);
  EXPECT_EQ(recipe->checkpoint().interval_steps(), 100);
  EXPECT_EQ(warning,
            "warning: train.steps (5) is shorter than the recipe's schedule: "
            "optimizer.warmup_steps (10) is clamped to 5; train.eval_interval (200) means one "
            "evaluation, at step 5; checkpoint.interval_steps (100) means one checkpoint, at "
            "step 5");
  EXPECT_EQ(warning.find('\n'), std::string::npos);
}

TEST(RecipeTest, QuickRunLeavesAFittingScheduleAndRefusesNegatives) {
  std::string warning = "unset";
  absl::StatusOr<Recipe> recipe = load_recipe(valid_recipe_path(), {}, &warning);
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->optimizer().warmup_steps(), 10);
  EXPECT_EQ(warning, "");
  recipe = load_recipe(valid_recipe_path(), {"train.steps=-1"}, &warning);
  EXPECT_TRUE(contains(recipe.status().message(), "train.steps (-1) must be >= 0"));
  recipe = load_recipe(valid_recipe_path(), {"train.steps=5", "optimizer.warmup_steps=-3"},
                       &warning);
  EXPECT_TRUE(contains(recipe.status().message(), "optimizer.warmup_steps (-3) must be >= 0"));
  // Without a place for the warning (saved recipes) a warmup beyond the steps is refused.
  EXPECT_TRUE(contains(validate_with({"train.steps=5"}).message(),
                       "optimizer.warmup_steps (10) must be <= train.steps (5)"));
}

}  // namespace
}  // namespace switchyard::config
