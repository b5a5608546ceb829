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

TEST(HfConfig, WrongTypesNullsAndMissingFieldsNamed) {
  EXPECT_EQ(error_of(with("hidden_size", "128")),
            "config.json: field hidden_size must be an integer in [1, 2147483647]");
  EXPECT_EQ(error_of(with("num_attention_heads", nullptr)),
            "config.json: field num_attention_heads must be an integer in [1, 2147483647]");
  nlohmann::json missing = mixtral_config();
  missing.erase("vocab_size");
  EXPECT_EQ(error_of(missing), "config.json: field vocab_size must be an integer in [1, 16777216]");
  EXPECT_EQ(error_of(with("model_type", 7)), "config.json: field model_type must be a string");
  EXPECT_EQ(error_of(with("rms_norm_eps", "small")),
            "config.json: field rms_norm_eps must be a finite number in [-3.40282e+38, "
            "3.40282e+38]");
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
            "config.json: field rope_theta must be a finite number in [-3.40282e+38, "
            "3.40282e+38]");
  EXPECT_NE(error_of(with("num_hidden_layers", 1000000000))
                .find("config.json: gives an invalid recipe: model.num_layers"),
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
