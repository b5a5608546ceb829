// Hugging Face config.json and model.safetensors.index.json read as untrusted text: a
// valid config gives its recipe, and wrong types, nulls, missing fields and sizes beyond
// the limits are one error naming the file and the field. Also the non-finite weight
// check and the names a conversion owns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_export.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/weights.h"

namespace switchyard {
namespace {

nlohmann::json mixtral_config() {
  return {{"model_type", "mixtral"},       {"vocab_size", 1024},
          {"hidden_size", 128},            {"intermediate_size", 256},
          {"num_hidden_layers", 2},        {"num_attention_heads", 4},
          {"num_key_value_heads", 2},      {"max_position_embeddings", 256},
          {"num_local_experts", 8},        {"num_experts_per_tok", 2},
          {"rms_norm_eps", 1e-5},          {"rope_theta", 10000.0}};
}

std::string error_of(const nlohmann::json& config) {
  const auto recipe = recipe_from_hf_config_text(config.dump(), "config.json", "m");
  EXPECT_FALSE(recipe.ok()) << config.dump();
  return recipe.ok() ? "" : std::string(recipe.status().message());
}

nlohmann::json with(const char* key, const nlohmann::json& value) {
  nlohmann::json config = mixtral_config();
  config[key] = value;
  return config;
}

TEST(HfConfig, ValidConfigGivesItsRecipe) {
  const auto recipe = recipe_from_hf_config_text(mixtral_config().dump(), "config.json", "m");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model().vocab_size(), 1024);
  EXPECT_EQ(recipe->model().num_layers(), 2);
  EXPECT_EQ(recipe->moe().num_experts(), 8);
  EXPECT_EQ(recipe->moe().expert_ffn_hidden_size(), 256);
}

// The RoPE base of a 4.x config is its top-level rope_theta; a 5.x rope_parameters'
// rope_theta takes its place.
TEST(HfConfig, RopeThetaFromEitherPlace) {
  const auto top_level =
      recipe_from_hf_config_text(with("rope_theta", 1e6).dump(), "config.json", "m");
  ASSERT_TRUE(top_level.ok()) << top_level.status();
  EXPECT_EQ(top_level->model().rope_theta(), 1e6f);
  nlohmann::json nested = mixtral_config();
  nested.erase("rope_theta");
  nested["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  const auto from_parameters = recipe_from_hf_config_text(nested.dump(), "config.json", "m");
  ASSERT_TRUE(from_parameters.ok()) << from_parameters.status();
  EXPECT_EQ(from_parameters->model().rope_theta(), 5e5f);
}

TEST(HfConfig, WrongTypesNullsAndMissingFieldsNamed) {
  EXPECT_EQ(error_of(with("hidden_size", "128")),
            "config.json: field hidden_size must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("num_attention_heads", nullptr)),
            "config.json: field num_attention_heads must be an integer in [1, 2147483647]");
  nlohmann::json missing = mixtral_config();
  missing.erase("num_key_value_heads");
  EXPECT_EQ(error_of(missing),
            "config.json: field num_key_value_heads must be an integer in [1, 4] (absent: "
            "transformers' default 8)");
  EXPECT_EQ(error_of(with("model_type", 7)), "config.json: field model_type must be a string");
  EXPECT_EQ(error_of(with("rms_norm_eps", "small")),
            "config.json: field rms_norm_eps must be a finite number in (0, 3.40282e+38]");
  EXPECT_EQ(error_of(with("rope_parameters", 3)),
            "config.json: field rope_parameters must be an object");
  EXPECT_EQ(error_of(with("hidden_act", 1)), "config.json: field hidden_act must be a string");
  EXPECT_EQ(error_of(nlohmann::json::array()), "config.json: not a JSON object");
}

TEST(HfConfig, SizesBounded) {
  EXPECT_EQ(error_of(with("vocab_size", int64_t{1} << 40)),
            "config.json: field vocab_size must be an integer in [1, 16777216]");
  EXPECT_EQ(error_of(with("num_hidden_layers", int64_t{1} << 40)),
            "config.json: field num_hidden_layers must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("num_key_value_heads", 8)),
            "config.json: field num_key_value_heads must be an integer in [1, 4]");
  EXPECT_EQ(error_of(with("num_experts_per_tok", 9)),
            "config.json: field num_experts_per_tok must be an integer in [1, 8]");
  EXPECT_EQ(error_of(with("rope_theta", 1e300)),
            "config.json: field rope_theta must be a finite number in (0, 3.40282e+38]");
  EXPECT_NE(error_of(with("num_hidden_layers", 1000000000))
                .find("config.json: gives an invalid recipe: model.num_layers"),
            std::string::npos);
}

// A field config.json leaves out is transformers' default for the family, never the
// engine's; null is a wrong type except where transformers gives it a meaning.
TEST(HfConfig, AbsentFieldsTakeTransformersDefaults) {
  nlohmann::json config = mixtral_config();
  for (const char* key : {"vocab_size", "rms_norm_eps", "rope_theta", "num_key_value_heads"})
    config.erase(key);
  config["num_attention_heads"] = 8;
  config["hidden_size"] = 256;
  const auto recipe = recipe_from_hf_config_text(config.dump(), "config.json", "m");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model().vocab_size(), 32000);
  EXPECT_EQ(recipe->model().norm_eps(), 1e-5f);
  EXPECT_EQ(recipe->model().rope_theta(), 1e6f);
  EXPECT_EQ(recipe->model().num_kv_heads(), 8);
  EXPECT_EQ(recipe->model().head_dim(), 32);  // hidden_size / num_attention_heads

  nlohmann::json olmoe = mixtral_config();
  olmoe.erase("num_local_experts");
  olmoe.erase("num_key_value_heads");
  olmoe.update({{"model_type", "olmoe"}, {"num_experts", 8}});
  const auto olmoe_recipe = recipe_from_hf_config_text(olmoe.dump(), "config.json", "m");
  ASSERT_TRUE(olmoe_recipe.ok()) << olmoe_recipe.status();
  EXPECT_EQ(olmoe_recipe->model().num_kv_heads(), 4);  // transformers' None: the heads
  EXPECT_EQ(olmoe_recipe->moe().aux_loss_coef(), 0.01f);

  const auto null_kv = recipe_from_hf_config_text(with("num_key_value_heads", nullptr).dump(),
                                                  "config.json", "m");
  ASSERT_TRUE(null_kv.ok()) << null_kv.status();
  EXPECT_EQ(null_kv->model().num_kv_heads(), 4);
  EXPECT_EQ(error_of(with("rms_norm_eps", nullptr)),
            "config.json: field rms_norm_eps must be a finite number in (0, 3.40282e+38]");
}

TEST(HfConfig, ExplicitZerosRefusedByName) {
  EXPECT_EQ(error_of(with("head_dim", 0)),
            "config.json: field head_dim must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("rms_norm_eps", 0)),
            "config.json: field rms_norm_eps must be a finite number in (0, 3.40282e+38]");
  EXPECT_EQ(error_of(with("rope_theta", 0)),
            "config.json: field rope_theta must be a finite number in (0, 3.40282e+38]");
  EXPECT_EQ(error_of(with("initializer_range", -0.02)),
            "config.json: field initializer_range must be a finite number in (0, 3.40282e+38]");
  EXPECT_EQ(error_of(with("num_key_value_heads", 0)),
            "config.json: field num_key_value_heads must be an integer in [1, 4]");
  EXPECT_EQ(error_of(with("max_position_embeddings", 0)),
            "config.json: field max_position_embeddings must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("intermediate_size", 256.0)),
            "config.json: field intermediate_size must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("router_aux_loss_coef", -1)),
            "config.json: field router_aux_loss_coef must be a finite number in [0, "
            "3.40282e+38]");
  EXPECT_EQ(error_of(with("tie_word_embeddings", 0)),
            "config.json: field tie_word_embeddings must be true or false");
}

nlohmann::json qwen3_moe_config() {
  nlohmann::json config = mixtral_config();
  config.erase("num_local_experts");
  config.update({{"model_type", "qwen3_moe"}, {"num_experts", 8}, {"head_dim", 48},
                 {"moe_intermediate_size", 64}, {"mlp_only_layers", {0}},
                 {"norm_topk_prob", true}, {"sliding_window", 4096}});
  return config;
}

TEST(HfConfig, Qwen3MoeGivesPerHeadNormsAndItsLayerPattern) {
  const auto recipe = recipe_from_hf_config_text(qwen3_moe_config().dump(), "config.json", "m");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_TRUE(recipe->model().qk_head_norm());
  EXPECT_FALSE(recipe->model().qk_norm());
  EXPECT_FALSE(recipe->model().attention_bias());
  EXPECT_EQ(recipe->model().head_dim(), 48);
  EXPECT_EQ(recipe->model().first_dense_layers(), 1);
  EXPECT_EQ(recipe->model().ffn_hidden_size(), 256);
  EXPECT_EQ(recipe->moe().expert_ffn_hidden_size(), 64);
  EXPECT_EQ(recipe->moe().num_shared_experts(), 0);
  EXPECT_EQ(recipe->moe().gating(), config::TOP_K);
  EXPECT_EQ(recipe->moe().score_function(), config::SOFTMAX);
  EXPECT_TRUE(recipe->moe().renormalize());
  // transformers 5.x saves the expert count as num_local_experts.
  nlohmann::json saved = qwen3_moe_config();
  saved.erase("num_experts");
  saved["num_local_experts"] = 4;
  const auto resaved = recipe_from_hf_config_text(saved.dump(), "config.json", "m");
  ASSERT_TRUE(resaved.ok()) << resaved.status();
  EXPECT_EQ(resaved->moe().num_experts(), 4);
  EXPECT_EQ(*hf_architecture_for(*recipe), "Qwen3MoeForCausalLM");
}

TEST(HfConfig, Qwen3MoeRefusalsNameTheField) {
  auto qwen3_with = [](const char* key, const nlohmann::json& value) {
    nlohmann::json config = qwen3_moe_config();
    config[key] = value;
    return config;
  };
  EXPECT_EQ(error_of(qwen3_with("attention_bias", true)),
            "config.json: attention_bias is true: Qwen3-MoE's output projection bias has no "
            "engine counterpart");
  EXPECT_EQ(error_of(qwen3_with("use_sliding_window", true)),
            "config.json: use_sliding_window is true: the engine attends to the whole window");
  EXPECT_EQ(error_of(qwen3_with("mlp_only_layers", {1})),
            "config.json: mlp_only_layers must be 0, 1, ... n-1: the engine's dense layers are "
            "the first n");
  EXPECT_EQ(error_of(qwen3_with("num_experts", "8")),
            "config.json: field num_experts must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(qwen3_with("head_dim", -2)),
            "config.json: field head_dim must be an integer in [1, 2147483647]");
}

TEST(HfExport, QkNormsPickTheirClassesAndRefusalsNameTheField) {
  auto recipe = recipe_from_hf_config_text(qwen3_moe_config().dump(), "config.json", "m");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  recipe->mutable_moe()->set_num_shared_experts(1);
  recipe->mutable_moe()->set_shared_expert_ffn_hidden_size(32);
  EXPECT_NE(hf_architecture_for(*recipe).status().message().find("moe.num_shared_experts"),
            std::string::npos);
  recipe->mutable_moe()->set_num_shared_experts(0);
  recipe->mutable_model()->set_attention_bias(true);
  EXPECT_NE(hf_architecture_for(*recipe).status().message().find("model.attention_bias"),
            std::string::npos);

  nlohmann::json olmoe = mixtral_config();
  olmoe.erase("num_local_experts");
  olmoe.update({{"model_type", "olmoe"}, {"num_experts", 8}});
  auto olmoe_recipe = recipe_from_hf_config_text(olmoe.dump(), "config.json", "m");
  ASSERT_TRUE(olmoe_recipe.ok()) << olmoe_recipe.status();
  EXPECT_EQ(*hf_architecture_for(*olmoe_recipe), "OlmoeForCausalLM");
  olmoe_recipe->mutable_model()->set_first_dense_layers(1);
  olmoe_recipe->mutable_model()->set_ffn_hidden_size(64);
  EXPECT_NE(hf_architecture_for(*olmoe_recipe).status().message().find("layer 0 is dense"),
            std::string::npos);
  olmoe_recipe->mutable_model()->set_first_dense_layers(0);
  olmoe_recipe->mutable_moe()->set_gating(config::GSHARD_TOP2);
  EXPECT_NE(hf_architecture_for(*olmoe_recipe).status().message().find("moe.gating GSHARD_TOP2"),
            std::string::npos);
}

TEST(HfWeightMap, NamesEachTensorsShard) {
  const auto map = parse_hf_weight_map(
      R"({"metadata":{"total_size":8},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})",
      "index.json");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->at("b"), "s2.safetensors");
}

TEST(HfWeightMap, RefusalsNameTheField) {
  EXPECT_EQ(parse_hf_weight_map(R"({"weight_map":{"a":5}})", "index.json").status().message(),
            "index.json: field weight_map.a must be a file name");
  EXPECT_EQ(parse_hf_weight_map(R"({"weight_map":[]})", "index.json").status().message(),
            "index.json: field weight_map must be an object");
  EXPECT_EQ(parse_hf_weight_map(R"({})", "index.json").status().message(),
            "index.json: field weight_map must be an object");
  EXPECT_EQ(parse_hf_weight_map("{", "index.json").status().message(),
            "index.json: not a JSON object");
}

TEST(Weights, NonFiniteValuesNamedWithTheirElement) {
  Tensor t = Tensor::zeros({4, 8});
  EXPECT_TRUE(check_finite(t, "w.safetensors", "x").ok());
  t.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(check_finite(t, "w.safetensors", "x").message(),
            "w.safetensors: tensor x holds NaN at element 17");
  t.data<float>()[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(check_finite(t, "w.safetensors", "x").message(),
            "w.safetensors: tensor x holds infinity at element 3");
}

TEST(Conversions, OwnOnlyTheirFiles) {
  for (const char* name : {"config.json", "model.safetensors", "model-00001-of-00003.safetensors",
                           "model-100000-of-100000.safetensors", "model.safetensors.index.json",
                           "tokenizer.model", "tokenizer.json", "config.json.partial"})
    EXPECT_TRUE(is_hf_export_file(name)) << name;
  for (const char* name : {"notes.txt", "model-1.safetensors", "model--of-2.safetensors",
                           "model-1-of-2.safetensors.bak", "recipe.textproto", "config.json.tmp"})
    EXPECT_FALSE(is_hf_export_file(name)) << name;
  for (const char* name : {"recipe.textproto", "model.safetensors", "tokenizer.model.partial"})
    EXPECT_TRUE(is_weights_file(name)) << name;
  for (const char* name : {"config.json", "notes.txt", "model-00001-of-00002.safetensors"})
    EXPECT_FALSE(is_weights_file(name)) << name;
}

}  // namespace
}  // namespace switchyard
