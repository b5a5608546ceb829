// The sigmoid router (moe.score_function SIGMOID, plain and group-limited), expert choice
// and forced balance inside the whole model: the backward against central finite differences of the
// total loss along a random direction per parameter (as transformer_grad_test does for
// the softmax gatings), the bias steering the choice, and round-robin loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "tests/finite_differences.h"

namespace switchyard {
namespace {

config::Recipe recipe_with(const std::string& moe_fields) {
  const std::string text = R"(
    name: "sigmoid-routing"
    model { vocab_size: 64 hidden_size: 16 num_layers: 2 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 init_std: 0.3 }
    moe { num_experts: 4 top_k: 2 z_loss_coef: 0.01 expert_ffn_hidden_size: 12 )" +
                           moe_fields + R"( }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 7 steps: 1 }
  )";
  auto recipe = config::parse_recipe(text, "sigmoid-routing");
  SY_CHECK(recipe.ok());
  return *recipe;
}

struct Model {
  explicit Model(const config::Recipe& recipe) : model(recipe, params) {
    params.allocate(cpu_device());
    params.initialize(11);
    Rng data(3);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(64));
      targets.data<int32_t>()[i] = static_cast<int32_t>(data.below(64));
    }
  }
  LossParts forward() {
    Rng rng(0);
    return model.forward(cpu_device(), ids, targets, /*training=*/true, rng);
  }
  ParamStore params;
  Transformer model;
  Tensor ids = Tensor::empty({2, 7}, DType::kI32);
  Tensor targets = Tensor::empty({2, 7}, DType::kI32);
};

class SigmoidRoutingGradTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SigmoidRoutingGradTest, BackwardMatchesFiniteDifferences) {
  Model m(recipe_with(GetParam()));
  // A bias that changes the choice (the parameters no gradient trains stay as they are).
  Rng perturb(5);
  for (Param& p : m.params.params())
    if (!p.trainable)
      for (int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data<float>()[i] = static_cast<float>(0.3 * perturb.normal());
  m.forward();
  m.model.backward(cpu_device(), 1.0f);
  const double eps = 1e-3;
  for (Param& p : m.params.params()) {
    if (!p.trainable) continue;
    const auto g = testing::directional_derivative(p, eps, [&] { return m.forward().total; });
    EXPECT_NEAR(g.analytic, g.numeric, 5e-3 * std::max(1.0, std::abs(g.numeric))) << p.name;
    EXPECT_NE(g.analytic, 0.0) << p.name;
  }
}

// No aux loss: its selection counts jump where a step flips a router's choice, which the
// forced case's untrained router does within 1e-3 here; the z-loss trains it instead.
INSTANTIATE_TEST_SUITE_P(
    Routing, SigmoidRoutingGradTest,
    ::testing::Values("gating: TOP_K score_function: SIGMOID",
                      "gating: TOP_K score_function: SIGMOID renormalize: true "
                      "routed_scaling_factor: 2.5 num_groups: 2 top_groups: 1",
                      "gating: TOP_K router_force_balance: true",
                      "gating: EXPERT_CHOICE capacity_factor: 1.5"));

TEST(SigmoidRouting, TheBiasSteersTheChoiceAndIsNotTrained) {
  Model m(recipe_with("gating: TOP_K score_function: SIGMOID bias_update_rate: 0.01"));
  Param* bias = m.params.find("model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_FALSE(bias->trainable);
  EXPECT_FALSE(bias->weight_decay);
  EXPECT_EQ(bias->value.data<float>()[2], 0.0f);  // starts at zero
  bias->value.data<float>()[2] = 5.0f;
  m.forward();
  const RouterStats& stats = m.model.router_stats();
  EXPECT_EQ(stats.layers[1].selections_per_expert[2], 14.0);  // every token takes expert 2
  EXPECT_LT(stats.layers[0].selections_per_expert[2], 14.0);
}

// Each expert takes ceil(cf x 14 tokens x 2 / 4) = 11 tokens at capacity factor 1.5,
// 7 at 0 (which means 1 for expert choice, as in inference).
TEST(ExpertChoice, EveryExpertTakesItsCapacity) {
  for (const auto& [factor, taken] : {std::pair{"1.5", 11.0}, std::pair{"0", 7.0}}) {
    Model m(recipe_with(std::string("gating: EXPERT_CHOICE capacity_factor: ") + factor));
    m.forward();
    for (const RouterStats::Layer& layer : m.model.router_stats().layers)
      for (double selections : layer.selections_per_expert) EXPECT_EQ(selections, taken);
    EXPECT_EQ(m.model.router_stats().dropped_assignments, 0);
  }
}

TEST(ForcedBalance, EveryExpertTakesTheSameLoad) {
  Model m(recipe_with("gating: TOP_K router_force_balance: true"));
  m.forward();
  // 14 tokens x top-2 over 4 experts: 7 each in every layer, whatever the router says.
  EXPECT_DOUBLE_EQ(m.model.router_stats().worst_load_ratio, 1.0);
}

}  // namespace
}  // namespace switchyard
