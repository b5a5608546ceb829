// bf16 compute against f32 on the same weights and data: the losses agree to bf16
// rounding, every gradient points the same way (cosine similarity) with about the same
// norm, and the working copies track the f32 masters through an optimizer step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace switchyard {
namespace {

config::Recipe recipe_for(const std::string& gating, float capacity_factor) {
  const std::string text = R"(
    name: "mixed-precision"
    model { vocab_size: 96 hidden_size: 32 num_layers: 3 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 40 first_dense_layers: 1
            attention_bias: true qk_norm: true init_std: 0.1 }
    moe { num_experts: 4 top_k: 2 gating: )" +
                           gating + R"( capacity_factor: )" + std::to_string(capacity_factor) + R"(
          aux_loss_coef: 0.01 z_loss_coef: 0.001 expert_ffn_hidden_size: 24
          num_shared_experts: 1 shared_expert_ffn_hidden_size: 16 shared_expert_gate: true }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 4 seq_len: 16 steps: 2 }
  )";
  auto recipe = config::parse_recipe(text, "mixed-precision");
  SY_CHECK(recipe.ok());
  return *recipe;
}

struct Model {
  Model(const config::Recipe& recipe, DType compute) : model(recipe, params) {
    params.allocate(cpu_device(), compute);
    params.initialize(5);
    refresh_working_copies(cpu_device(), params);
  }
  ParamStore params;
  Transformer model;
};

double cosine(const Tensor& a, const Tensor& b, double* norm_ratio) {
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  *norm_ratio = std::sqrt(aa / bb);
  return dot / std::sqrt(aa * bb);
}

class MixedPrecisionTest : public ::testing::TestWithParam<std::pair<std::string, float>> {};

TEST_P(MixedPrecisionTest, Bf16TracksF32) {
  const config::Recipe recipe = recipe_for(GetParam().first, GetParam().second);
  Model f32(recipe, DType::kF32);
  Model b16(recipe, DType::kBF16);
  for (const Param& p : b16.params.params()) {
    if (p.shape.size() >= 2) {
      EXPECT_EQ(p.work.dtype(), DType::kBF16) << p.name;
      EXPECT_EQ(p.work.data<bf16>()[0].bits, to_bf16(p.value.data<float>()[0]).bits) << p.name;
    } else {
      EXPECT_EQ(p.work.raw_data(), p.value.raw_data()) << p.name;
    }
  }

  Tensor ids = Tensor::empty({4, 16}, DType::kI32), targets = Tensor::empty({4, 16}, DType::kI32);
  Rng data(9);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(96));
    targets.data<int32_t>()[i] = static_cast<int32_t>(data.below(96));
  }
  Rng r1(1), r2(1);
  const LossParts a = f32.model.forward(cpu_device(), ids, targets, true, r1);
  const LossParts b = b16.model.forward(cpu_device(), ids, targets, true, r2);
  EXPECT_NEAR(b.cross_entropy, a.cross_entropy, 0.01 * a.cross_entropy);
  EXPECT_NEAR(b.aux_loss, a.aux_loss, 0.05 * a.aux_loss);
  EXPECT_NEAR(b.z_loss, a.z_loss, 0.05 * a.z_loss);
  f32.model.backward(cpu_device(), 1.0f);
  b16.model.backward(cpu_device(), 1.0f);
  for (size_t i = 0; i < f32.params.params().size(); ++i) {
    const Param& p = f32.params.params()[i];
    const Param& q = b16.params.params()[i];
    ASSERT_EQ(q.grad.dtype(), DType::kF32) << q.name;
    double ratio = 0;
    const double c = cosine(q.grad, p.grad, &ratio);
    EXPECT_GT(c, 0.98) << p.name;
    EXPECT_NEAR(ratio, 1.0, 0.1) << p.name;
  }

  AdamWOptimizer optimizer(recipe.optimizer(), 2, b16.params, {}, cpu_device());
  optimizer.step(cpu_device());
  for (const Param& p : b16.params.params()) {
    if (p.shape.size() < 2) continue;
    for (int64_t i = 0; i < p.value.numel(); i += 17) {
      ASSERT_EQ(p.work.data<bf16>()[i].bits, to_bf16(p.value.data<float>()[i]).bits) << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Gating, MixedPrecisionTest,
                         ::testing::Values(std::make_pair(std::string("TOP_K"), 0.0f),
                                           std::make_pair(std::string("GSHARD_TOP2"), 0.0f),
                                           std::make_pair(std::string("TOP_K"), 1.25f)));

}  // namespace
}  // namespace switchyard
