// Activation recomputation (train.recompute) changes what a training forward keeps, not
// what the model computes: SELECTIVE and FULL (every layer, or the first N) give the
// losses, the routing statistics and every gradient of NONE bit for bit, GShard's random
// dispatch replayed rather than drawn again, in f32 and in bf16; and they keep fewer
// activation bytes at the end of the forward.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace switchyard {
namespace {

struct Case {
  std::string name;
  std::string model;  // extra model fields
  std::string moe;    // the moe section's fields
  DType compute = DType::kF32;
};

config::Recipe recipe_for(const Case& c, const std::string& recompute) {
  const std::string text = R"(
    name: "recompute"
    model { vocab_size: 96 hidden_size: 32 num_layers: 3 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 40 init_std: 0.1 )" +
                           c.model + R"( }
    moe { )" + c.moe + R"( }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 4 seq_len: 16 steps: 2 )" +
                           recompute + R"( }
  )";
  auto recipe = config::parse_recipe(text, "recompute");
  SY_CHECK_MSG(recipe.ok(), std::string(recipe.status().message()).c_str());
  return *recipe;
}

// Two micro-batches' forward and backward, gradients accumulating, each micro-batch with
// its own random stream: a recomputation that drew other numbers than its forward would
// show.
struct Outcome {
  std::vector<LossParts> losses;
  std::vector<std::vector<double>> selections;  // router_stats() after each backward
  std::vector<double> aux;
  ParamStore params;
  int64_t forward_end_activations = 0;  // activation bytes held between forward and backward
};

void run(const config::Recipe& recipe, DType compute, Outcome& out) {
  Transformer model(recipe, out.params);
  out.params.allocate(cpu_device(), compute);
  out.params.initialize(5);
  refresh_working_copies(cpu_device(), out.params);
  const int kind = static_cast<int>(MemoryKind::kActivations);
  for (int micro = 0; micro < 2; ++micro) {
    const Rng rng = Rng(11).fork(micro);
    Tensor ids = Tensor::empty({2, 16}, DType::kI32), targets = Tensor::empty({2, 16}, DType::kI32);
    Rng data(9 + micro);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(96));
      targets.data<int32_t>()[i] = static_cast<int32_t>(data.below(96));
    }
    const int64_t before = cpu_device().memory_stats().current_bytes[kind];
    out.losses.push_back(model.forward(cpu_device(), ids, targets, /*training=*/true, rng));
    out.forward_end_activations = cpu_device().memory_stats().current_bytes[kind] - before;
    model.backward(cpu_device(), 0.5f);
    out.selections.push_back(model.router_stats().selections_per_expert);
    out.aux.push_back(model.router_stats().aux_loss(recipe.moe().aux_loss_per_layer()));
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0;
}

class RecomputeTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeTest, LossesAndGradientsMatchNoneBitForBit) {
  const Case& c = GetParam();
  Outcome none;
  run(recipe_for(c, ""), c.compute, none);
  for (const std::string mode : {"recompute: SELECTIVE", "recompute: FULL",
                                 "recompute: FULL recompute_layers: 1",
                                 "recompute: FULL recompute_layers: 2"}) {
    SCOPED_TRACE(mode);
    Outcome other;
    run(recipe_for(c, mode), c.compute, other);
    for (size_t m = 0; m < none.losses.size(); ++m) {
      EXPECT_EQ(other.losses[m].total, none.losses[m].total);
      EXPECT_EQ(other.losses[m].cross_entropy, none.losses[m].cross_entropy);
      EXPECT_EQ(other.losses[m].aux_loss, none.losses[m].aux_loss);
      EXPECT_EQ(other.losses[m].z_loss, none.losses[m].z_loss);
      EXPECT_EQ(other.selections[m], none.selections[m]);
      EXPECT_EQ(other.aux[m], none.aux[m]);
    }
    const auto& expected = none.params.params();
    const auto& got = other.params.params();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_bits(got[i].grad, expected[i].grad)) << got[i].name;
    // Each mode keeps less until the backward than NONE does.
    EXPECT_LT(other.forward_end_activations, none.forward_end_activations);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, RecomputeTest,
    ::testing::Values(
        Case{"dense", "first_dense_layers: 3", "num_experts: 4 top_k: 2 expert_ffn_hidden_size: 24"},
        Case{"moe_shared_qk_norm", "first_dense_layers: 1 qk_norm: true attention_bias: true",
             "num_experts: 4 top_k: 2 gating: TOP_K aux_loss_coef: 0.01 z_loss_coef: 0.001 "
             "expert_ffn_hidden_size: 24 num_shared_experts: 1 shared_expert_ffn_hidden_size: 16 "
             "shared_expert_gate: true"},
        Case{"gshard_capacity", "qk_head_norm: true head_dim: 8",
             "num_experts: 4 top_k: 2 gating: GSHARD_TOP2 capacity_factor: 1.0 "
             "aux_loss_coef: 0.01 expert_ffn_hidden_size: 24"},
        Case{"sigmoid_bias", "",
             "num_experts: 4 top_k: 2 gating: TOP_K score_function: SIGMOID "
             "bias_update_rate: 0.001 expert_ffn_hidden_size: 24"},
        Case{"expert_choice", "",
             "num_experts: 4 top_k: 2 gating: EXPERT_CHOICE capacity_factor: 1.0 "
             "expert_ffn_hidden_size: 24"},
        Case{"moe_bf16", "first_dense_layers: 1",
             "num_experts: 4 top_k: 2 gating: GSHARD_TOP2 aux_loss_coef: 0.01 "
             "expert_ffn_hidden_size: 24 num_shared_experts: 1 shared_expert_ffn_hidden_size: 16",
             DType::kBF16}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(RecomputeRecipe, RefusesBadFields) {
  const auto parse = [](const std::string& train) {
    const std::string text = R"(
      name: "recompute"
      model { vocab_size: 96 hidden_size: 32 num_layers: 3 num_heads: 4 rope_theta: 10000
              norm_eps: 1e-5 ffn_hidden_size: 40 }
      moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 24 }
      optimizer { lr: 1e-3 }
      data { dataset: "dataset" }
      train { global_batch_size: 4 seq_len: 16 steps: 2 )" + train + " }";
    const auto recipe = config::parse_recipe(text, "recompute");
    return recipe.ok() ? config::validate_recipe(*recipe) : recipe.status();
  };
  EXPECT_TRUE(parse("recompute: FULL recompute_layers: 3").ok());
  EXPECT_NE(parse("recompute: FULL recompute_layers: 4").message().find("train.recompute_layers"),
            std::string::npos);
  EXPECT_NE(parse("recompute: FULL recompute_layers: -1").message().find("train.recompute_layers"),
            std::string::npos);
  EXPECT_NE(parse("recompute: SELECTIVE recompute_layers: 1").message().find("FULL"),
            std::string::npos);
  EXPECT_NE(parse("recompute: 7").message().find("train.recompute"), std::string::npos);
}

}  // namespace
}  // namespace switchyard
