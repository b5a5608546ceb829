// Whole-model gradient check: for every parameter, the directional derivative along a
// random direction from central finite differences of the total loss (cross-entropy +
// aux + z-loss) must match the backward pass. Covers dense and MoE layers, shared
// experts with their gate, q/k norms (whole projection and per head), q/k/v biases, each gating variant and capacity,
// GShard's sampled second expert in training mode, and multi-token prediction modules
// (their norms, eh_proj, MoE blocks and the shared embedding and head).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "tests/finite_differences.h"

namespace switchyard {
namespace {

struct Case {
  std::string gating;  // moe.gating, and any moe settings after it
  float capacity_factor;
  bool aux_loss_per_layer = false;
  // Training-mode routing: GShard samples each token's second expert (the same draws in
  // every forward here, from one seed).
  bool training = false;
  // The finite-difference step. At capacity, GShard's sampled routing is discontinuous
  // in the router weights: a step of 1e-3 along layer 2's gate moves one token across a
  // capacity or sampling threshold (a jump in the loss), 1e-4 does not.
  double eps = 1e-3;
  // The q/k norm: over the whole projection (OLMoE) or per head (Qwen3-MoE, here with a
  // head_dim other than hidden / heads).
  std::string qk_norm = "qk_norm: true";
  int mtp_depth = 0;  // model.mtp_depth
};

config::Recipe tiny_recipe(const Case& c) {
  const std::string text = R"(
    name: "grad-check"
    model { vocab_size: 64 hidden_size: 16 num_layers: 3 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 24 first_dense_layers: 1
            attention_bias: true )" + c.qk_norm + R"( init_std: 0.3
            mtp_depth: )" + std::to_string(c.mtp_depth) + R"( mtp_loss_coef: 0.7 }
    moe { num_experts: 4 top_k: 2 gating: )" + c.gating + R"( capacity_factor: )" +
                           std::to_string(c.capacity_factor) + R"(
          aux_loss_coef: 0.1 z_loss_coef: 0.01 expert_ffn_hidden_size: 12
          aux_loss_per_layer: )" + (c.aux_loss_per_layer ? "true" : "false") + R"(
          num_shared_experts: 1 shared_expert_ffn_hidden_size: 8 shared_expert_gate: true }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 7 steps: 1 }
  )";
  auto recipe = config::parse_recipe(text, "grad-check");
  SY_CHECK(recipe.ok());
  return *recipe;
}

class TransformerGradTest : public ::testing::TestWithParam<Case> {};

TEST_P(TransformerGradTest, BackwardMatchesFiniteDifferences) {
  const config::Recipe recipe = tiny_recipe(GetParam());
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(11);
  // Non-trivial norm gains and biases.
  Rng perturb(5);
  for (Param& p : params.params())
    if (p.init != ParamInit::kNormal)
      for (int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data<float>()[i] += static_cast<float>(0.2 * perturb.normal());

  Tensor ids = Tensor::empty({2, 7}, DType::kI32), targets = Tensor::empty({2, 7}, DType::kI32);
  Rng data(3);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(64));
    targets.data<int32_t>()[i] = i % 7 == 6 ? -1 : static_cast<int32_t>(data.below(64));
  }
  const bool training = GetParam().training;
  auto forward = [&]() {
    Rng rng(0);
    return model.forward(cpu_device(), ids, targets, training, rng);
  };
  auto loss = [&]() { return forward().total; };
  const LossParts parts = forward();
  EXPECT_GT(parts.aux_loss, 0);
  EXPECT_GT(parts.z_loss, 0);
  EXPECT_EQ(parts.mtp_loss > 0, GetParam().mtp_depth > 0);
  model.backward(cpu_device(), 1.0f);

  const double eps = GetParam().eps;
  for (Param& p : params.params()) {
    const auto g = testing::directional_derivative(p, eps, loss);
    EXPECT_NEAR(g.analytic, g.numeric, 5e-3 * std::max(1.0, std::abs(g.numeric))) << p.name;
    EXPECT_NE(g.analytic, 0.0) << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Gating, TransformerGradTest,
                         ::testing::Values(Case{"TOP_K", 0.0f},
                                           Case{"TOP_K renormalize: false", 0.0f},
                                           Case{"GSHARD_TOP2", 0.0f}, Case{"TOP_K", 1.0f},
                                           Case{"TOP_K", 0.0f, true},
                                           Case{"GSHARD_TOP2", 0.0f, false, true},
                                           Case{"GSHARD_TOP2", 1.0f, false, true, 1e-4},
                                           Case{"TOP_K", 0.0f, false, false, 1e-3,
                                                "qk_head_norm: true head_dim: 6"},
                                           Case{"TOP_K", 0.0f, false, false, 1e-3,
                                                "qk_norm: true", 2},
                                           // A step of 1e-3 along the MTP layer's gate
                                           // moves a sampled second expert across its
                                           // threshold; 1e-4 does not.
                                           Case{"GSHARD_TOP2", 0.0f, false, true, 1e-4,
                                                "qk_norm: true", 1}));

// The sampled second expert: training-mode GShard routing drops some tokens' second
// expert, so its loss differs from the deterministic (evaluation) routing's, and it
// depends on the seed; the gradient checks above then cover the sampled dispatch.
TEST(GshardTrainingRouting, SamplesTheSecondExpert) {
  const config::Recipe recipe = tiny_recipe(Case{"GSHARD_TOP2", 0.0f});
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(11);
  Tensor ids = Tensor::empty({2, 7}, DType::kI32), targets = Tensor::empty({2, 7}, DType::kI32);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 37) % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>((i * 11 + 5) % 64);
  }
  auto loss = [&](bool training, uint64_t seed) {
    Rng rng(seed);
    return model.forward(cpu_device(), ids, targets, training, rng).total;
  };
  EXPECT_EQ(loss(true, 0), loss(true, 0));
  EXPECT_NE(loss(true, 0), loss(false, 0));
  EXPECT_NE(loss(true, 0), loss(true, 1));
}

}  // namespace
}  // namespace switchyard
