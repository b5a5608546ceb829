// Checkpoint manifests as untrusted input: parse_manifest refuses every damaged field
// with one error naming the manifest and the field, and the slices of a tensor must tile
// it exactly.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/config/recipe.h"
#include "google/protobuf/unknown_field_set.h"

namespace switchyard {
namespace {

config::Recipe valid_recipe() {
  config::Recipe recipe;
  recipe.set_name("t");
  recipe.mutable_data()->set_dataset("dataset");
  config::ModelConfig& model = *recipe.mutable_model();
  model.set_vocab_size(64);
  model.set_hidden_size(16);
  model.set_num_layers(1);
  model.set_num_heads(2);
  model.set_moe_layer_interval(1);
  recipe.mutable_moe()->set_num_experts(2);
  recipe.mutable_moe()->set_top_k(1);
  recipe.mutable_moe()->set_expert_ffn_hidden_size(32);
  config::TrainConfig& train = *recipe.mutable_train();
  train.set_steps(10);
  train.set_global_batch_size(2);
  train.set_micro_batch_size(2);
  train.set_seq_len(8);
  recipe.mutable_optimizer()->set_lr(1e-3);
  config::fill_defaults(recipe);
  return recipe;
}

checkpoint::TensorSlice* add_slice(checkpoint::Manifest& m, int64_t first_row, int64_t rows) {
  checkpoint::TensorSlice* s = m.add_slices();
  s->set_tensor("param/model.w");
  s->set_dataset("param/model.w");
  s->add_global_shape(4);
  s->add_global_shape(3);
  s->set_tensor_parallel_dim(-1);
  s->set_first_row(first_row);
  s->set_rows(rows);
  s->set_file("rank_0.h5");
  s->set_sha256(std::string(64, 'a'));
  return s;
}

// Rows [0, 2) and [2, 4) of a [4, 3] tensor.
checkpoint::Manifest valid_manifest() {
  checkpoint::Manifest m;
  m.set_format_version(2);
  *m.mutable_recipe() = valid_recipe();
  m.set_step(1);
  add_slice(m, 0, 2);
  add_slice(m, 2, 2);
  return m;
}

std::string error_of(const checkpoint::Manifest& m) {
  const auto parsed = parse_manifest(m.SerializeAsString(), "m.pb");
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(CheckpointManifest, ValidManifestParses) {
  const auto parsed = parse_manifest(valid_manifest().SerializeAsString(), "m.pb");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->slices_size(), 2);
}

TEST(CheckpointManifest, GarbageAndTruncatedBytesAreRefused) {
  EXPECT_FALSE(parse_manifest(std::string(100, '\xff'), "m.pb").ok());
  const std::string bytes = valid_manifest().SerializeAsString();
  EXPECT_FALSE(parse_manifest(bytes.substr(0, bytes.size() - 7), "m.pb").ok());
}

TEST(CheckpointManifest, OtherFormatVersionIsRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.set_format_version(1);
  EXPECT_EQ(error_of(m),
            "m.pb: field format_version is 1, expected 2 (written by another version of the "
            "engine)");
}

TEST(CheckpointManifest, InvalidRecipeIsRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.mutable_recipe()->mutable_model()->set_hidden_size(-1);
  EXPECT_NE(error_of(m).find("m.pb: field recipe: "), std::string::npos);
}

// A manifest written before moe.score_function and moe.renormalize names its routing by
// the gatings now reserved (TOPK_SOFTMAX 1, SOFTMAX_TOPK 2, SIGMOID_TOPK 4) and
// moe.norm_topk_prob (field 12). It parses as the recipe that spells the routing anew,
// byte for byte: what resuming compares.
TEST(CheckpointManifest, LegacyRoutingReadsAsTheNewSettings) {
  struct Legacy {
    int gating;
    bool norm_topk_prob;
    config::ScoreFunction score_function;
    bool renormalize;
  };
  for (const Legacy& legacy : {Legacy{1, false, config::SOFTMAX, true},
                               Legacy{2, false, config::SOFTMAX, false},
                               Legacy{4, false, config::SIGMOID, false},
                               Legacy{4, true, config::SIGMOID, true}}) {
    config::Recipe now = valid_recipe();
    now.mutable_moe()->set_score_function(legacy.score_function);
    now.mutable_moe()->set_renormalize(legacy.renormalize);
    config::fill_defaults(now);
    checkpoint::Manifest old = valid_manifest();
    *old.mutable_recipe() = now;
    config::MoeConfig& moe = *old.mutable_recipe()->mutable_moe();
    moe.clear_score_function();
    moe.clear_renormalize();
    moe.set_gating(static_cast<config::Gating>(legacy.gating));
    if (legacy.norm_topk_prob) moe.GetReflection()->MutableUnknownFields(&moe)->AddVarint(12, 1);
    const auto parsed = parse_manifest(old.SerializeAsString(), "m.pb");
    ASSERT_TRUE(parsed.ok()) << legacy.gating << ": " << parsed.status();
    EXPECT_EQ(parsed->recipe().moe().SerializeAsString(), now.moe().SerializeAsString())
        << legacy.gating << ": " << parsed->recipe().moe().ShortDebugString();
  }
}

TEST(CheckpointManifest, StepBeyondItsRecipeIsRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.set_step(m.recipe().train().steps() + 1);
  EXPECT_NE(error_of(m).find("field step"), std::string::npos);
}

TEST(CheckpointManifest, SliceFileOutsideTheCheckpointIsRefused) {
  for (const char* file : {"../../x", "/etc/passwd", "a/b", "..", ""}) {
    checkpoint::Manifest m = valid_manifest();
    m.mutable_slices(1)->set_file(file);
    EXPECT_NE(error_of(m).find("field slices[1].file"), std::string::npos) << file;
  }
}

TEST(CheckpointManifest, BadNamesAndChecksumsAreRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.mutable_slices(0)->set_dataset("/../x");
  EXPECT_NE(error_of(m).find("field slices[0].dataset"), std::string::npos);
  m = valid_manifest();
  m.mutable_slices(0)->set_tensor("");
  EXPECT_NE(error_of(m).find("field slices[0].tensor"), std::string::npos);
  m = valid_manifest();
  m.mutable_slices(0)->set_sha256("abc");
  EXPECT_NE(error_of(m).find("field slices[0].sha256"), std::string::npos);
}

TEST(CheckpointManifest, NegativeOrOverflowingShapesAreRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.mutable_slices(0)->set_global_shape(1, -3);
  EXPECT_NE(error_of(m).find("field slices[0].global_shape"), std::string::npos);
  m = valid_manifest();
  for (int i = 0; i < 2; ++i) {
    m.mutable_slices(i)->set_global_shape(0, int64_t{1} << 40);
    m.mutable_slices(i)->set_global_shape(1, int64_t{1} << 40);
  }
  EXPECT_NE(error_of(m).find("overflows"), std::string::npos);
}

TEST(CheckpointManifest, RowsOutsideTheShapeAreRefused) {
  checkpoint::Manifest m = valid_manifest();
  m.mutable_slices(1)->set_rows(3);
  EXPECT_NE(error_of(m).find("field slices[1].rows"), std::string::npos);
  m = valid_manifest();
  m.mutable_slices(1)->set_first_row(-1);
  EXPECT_NE(error_of(m).find("field slices[1].rows"), std::string::npos);
}

TEST(CheckpointManifest, SlicesMustTileEachTensorExactly) {
  checkpoint::Manifest overlap = valid_manifest();
  overlap.mutable_slices(1)->set_first_row(1);
  overlap.mutable_slices(1)->set_rows(3);
  EXPECT_NE(error_of(overlap).find("overlaps"), std::string::npos);
  // Row counts summing to dimension 0 are not enough: [0, 2) twice covers no row 2 or 3.
  checkpoint::Manifest twice = valid_manifest();
  twice.mutable_slices(1)->set_first_row(0);
  EXPECT_NE(error_of(twice).find("overlaps"), std::string::npos);
  checkpoint::Manifest gap = valid_manifest();
  gap.mutable_slices(1)->set_first_row(3);
  gap.mutable_slices(1)->set_rows(1);
  EXPECT_NE(error_of(gap).find("gap"), std::string::npos);
  checkpoint::Manifest short_tail = valid_manifest();
  short_tail.mutable_slices(1)->set_rows(1);
  EXPECT_NE(error_of(short_tail).find("rows [3, 4) of param/model.w are in no slice"),
            std::string::npos);
}

TEST(CheckpointManifest, SlicesOfOneTensorMustAgreeOnItsShape) {
  checkpoint::Manifest m = valid_manifest();
  m.mutable_slices(1)->set_global_shape(1, 5);
  EXPECT_NE(error_of(m).find("differs"), std::string::npos);
}

}  // namespace
}  // namespace switchyard
