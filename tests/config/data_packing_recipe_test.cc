// The data fields of document-aware packing: data.document_attention and data.packing
// parse and override, and latent attention refuses document attention in one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/recipe.h"

namespace switchyard::config {
namespace {

constexpr char kRecipe[] = R"pb(
  name: "packing"
  model { vocab_size: 512 hidden_size: 64 num_layers: 2 num_heads: 4 }
  moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 64 }
  optimizer { lr: 1e-3 }
  train { global_batch_size: 4 seq_len: 32 steps: 10 }
  data { dataset: "chat" }
)pb";

absl::StatusOr<Recipe> load_with(const std::vector<std::string>& overrides) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "data_packing.textproto";
  std::ofstream(path) << kRecipe;
  return load_recipe(path.string(), overrides);
}

TEST(DataPackingRecipe, DefaultsPackWithoutDocuments) {
  const absl::StatusOr<Recipe> recipe = load_with({});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_FALSE(recipe->data().document_attention());
  EXPECT_EQ(recipe->data().packing(), PACK);
}

TEST(DataPackingRecipe, OverridesSetBoth) {
  const absl::StatusOr<Recipe> recipe =
      load_with({"data.document_attention=true", "data.packing=PAD"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_TRUE(recipe->data().document_attention());
  EXPECT_EQ(recipe->data().packing(), PAD);
}

TEST(DataPackingRecipe, LatentAttentionTakesDocumentAttention) {
  const std::vector<std::string> both = {
      "model.mla.kv_lora_rank=16", "model.mla.qk_nope_head_dim=16", "model.mla.qk_rope_head_dim=8",
      "model.mla.v_head_dim=16", "data.document_attention=true"};
  const absl::StatusOr<Recipe> recipe = load_with(both);
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_TRUE(recipe->data().document_attention());
}

}  // namespace
}  // namespace switchyard::config
