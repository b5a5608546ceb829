// Upcycling (checkpoint/upcycle.h) in the engine alone: a dense model of random weights
// and its upcycled mixture of experts give the same logits, for copies of the whole FFN
// and for finer experts; the dense families' config.json fields read as a dense recipe;
// options that cannot give the dense model are refused naming the option.
#include "checkpoint/upcycle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "core/config/recipe.h"
#include "core/runtime/rng.h"
#include "engine/model/transformer.h"

namespace switchyard {
namespace {

nlohmann::json llama_config() {
  return {{"model_type", "llama"},    {"vocab_size", 64},
          {"hidden_size", 32},        {"intermediate_size", 48},
          {"num_hidden_layers", 2},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},     {"initializer_range", 0.2}};
}

config::Recipe recipe_of(const nlohmann::json& config) {
  auto recipe = recipe_from_hf_config_text(config.dump(), "config.json", "dense");
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *recipe : config::Recipe();
}

// A dense model of the recipe with random weights, as read_hf_dense_model gives it.
HfModel dense_model(const config::Recipe& recipe) {
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(17);
  HfModel out{recipe, {}, ""};
  for (const Param& p : params.params()) out.tensors.emplace_back(p.name, p.value);
  return out;
}

// The model's logits for a fixed batch of random tokens.
Tensor logits_of(const HfModel& weights) {
  ParamStore params;
  Transformer model(weights.recipe, params);
  params.allocate(cpu_device());
  std::map<std::string, Tensor> by_name(weights.tensors.begin(), weights.tensors.end());
  for (Param& p : params.params()) {
    EXPECT_TRUE(by_name.count(p.name)) << p.name;
    if (by_name.count(p.name)) p.value.copy_from(by_name.at(p.name));
    by_name.erase(p.name);
  }
  EXPECT_TRUE(by_name.empty()) << by_name.begin()->first << " has no parameter";
  Tensor ids = Tensor::empty({2, 12}, DType::kI32);
  Rng rng(3);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng.below(64));
  return model.logits(cpu_device(), ids);
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.data<float>()[i])));
  }
  return diff / scale;
}

class UpcycleShapes : public testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(UpcycleShapes, FirstForwardEqualsTheDenseModels) {
  const auto [experts, top_k, granularity] = GetParam();
  const HfModel dense = dense_model(recipe_of(llama_config()));
  const auto moe = upcycle(dense, {experts, top_k, granularity, 5});
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->recipe.moe().num_experts(), experts);
  EXPECT_EQ(moe->recipe.moe().expert_ffn_hidden_size(), 48 / granularity);
  EXPECT_EQ(moe->recipe.moe().gating(), config::TOP_K);
  EXPECT_EQ(moe->recipe.moe().score_function(), config::SOFTMAX);
  EXPECT_TRUE(moe->recipe.moe().renormalize());
  EXPECT_TRUE(config::is_moe_layer(moe->recipe, 0) && config::is_moe_layer(moe->recipe, 1));
  // fp32: the experts' sum adds the same products in another order.
  EXPECT_LT(max_relative_difference(logits_of(*moe), logits_of(dense)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(CopiesAndSlices, UpcycleShapes,
                         testing::Values(std::make_tuple(4, 2, 1), std::make_tuple(8, 4, 2),
                                         std::make_tuple(12, 3, 3), std::make_tuple(4, 4, 4)));

TEST(Upcycle, QwenTwoKeepsItsBiasesAndMistralItsWindowIsRefused) {
  nlohmann::json qwen2 = llama_config();
  qwen2["model_type"] = "qwen2";
  const config::Recipe recipe = recipe_of(qwen2);
  EXPECT_TRUE(recipe.model().attention_bias());
  EXPECT_EQ(recipe.model().ffn_hidden_size(), 48);
  EXPECT_FALSE(config::is_moe_layer(recipe, 0));
  const HfModel dense = dense_model(recipe);
  const auto moe = upcycle(dense, {4, 2, 2, 0});
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_LT(max_relative_difference(logits_of(*moe), logits_of(dense)), 1e-5);

  nlohmann::json mistral = llama_config();
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 4096;
  const auto refused = recipe_from_hf_config_text(mistral.dump(), "config.json", "m");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "config.json: sliding_window is set: the engine attends to the whole window");
}

TEST(Upcycle, OptionsThatCannotGiveTheDenseModelAreRefusedByName) {
  const HfModel dense = dense_model(recipe_of(llama_config()));
  const std::pair<UpcycleOptions, std::string> cases[] = {
      {{0, 1, 1, 0}, "--experts (0) must be in [1, 1048576]"},
      {{4, 0, 1, 0}, "--top-k (0) must be in [1, 1048576]"},
      {{4, 2, -1, 0}, "--granularity (-1) must be in [1, 1048576]"},
      {{10, 5, 5, 0}, "--granularity (5) must divide the dense FFN's intermediate_size (48)"},
      {{6, 4, 4, 0}, "--experts (6) must be a multiple of --granularity (4)"},
      {{8, 2, 4, 0},
       "--top-k (2) must be a multiple of --granularity (4): the chosen experts must be whole "
       "copies of the FFN"},
      {{4, 8, 1, 0}, "--top-k (8) must be at most --experts (4)"},
  };
  for (const auto& [options, message] : cases) {
    const auto moe = upcycle(dense, options);
    ASSERT_FALSE(moe.ok()) << message;
    EXPECT_EQ(moe.status().message(), message);
  }
  const auto too_many = upcycle(dense, {8192, 2, 1, 0});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("moe.num_experts"), std::string::npos)
      << too_many.status();
}

}  // namespace
}  // namespace switchyard
