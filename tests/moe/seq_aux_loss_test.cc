// The sequence-wise auxiliary loss (moe.seq_aux_loss_coef): its per-sequence sums against
// sums taken apart (also when a rank's rows start inside a sequence), the MoE layer's
// loss against a double-precision reference routed here from the same weights, its
// router gradient against central finite differences of that reference, and the
// recipe's refusal of a negative or non-finite coefficient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/config/recipe.h"
#include "core/runtime/rng.h"
#include "kernels/sequence_aux.h"
#include "moe/moe_layer.h"
#include "tests/finite_differences.h"
#include "tests/moe/small_moe_layer.h"

namespace switchyard {
namespace {

constexpr int kExperts = testing::kSmallLayerExperts;
constexpr int kTopK = testing::kSmallLayerTopK;
constexpr int64_t kHidden = testing::kSmallLayerHidden;
constexpr int64_t kSeqLen = 5;
constexpr int64_t kSequences = 3;
constexpr int64_t kTokens = kSeqLen * kSequences;

// Probabilities that sum to 1 per row (normalize false) or sigmoid-like scores in (0, 1).
Tensor random_scores(int64_t n, bool sum_to_one, uint64_t seed) {
  Tensor p = Tensor::empty({n, kExperts}, DType::kF32);
  Rng rng(seed);
  for (int64_t t = 0; t < n; ++t) {
    float* row = p.data<float>() + t * kExperts;
    for (int e = 0; e < kExperts; ++e) row[e] = static_cast<float>(0.05 + 0.9 * rng.uniform());
    if (sum_to_one) {
      const float total = std::accumulate(row, row + kExperts, 0.0f);
      for (int e = 0; e < kExperts; ++e) row[e] /= total;
    }
  }
  return p;
}

Tensor random_ids(int64_t n, uint64_t seed) {
  Tensor ids = Tensor::empty({n, kTopK}, DType::kI32);
  Rng rng(seed);
  for (int64_t t = 0; t < n; ++t) {
    ids.data<int32_t>()[t * kTopK] = static_cast<int32_t>(rng.below(kExperts));
    // A dropped slot (-1) counts for no expert.
    ids.data<int32_t>()[t * kTopK + 1] =
        t % 4 == 3 ? -1 : static_cast<int32_t>(rng.below(kExperts));
  }
  return ids;
}

// The sums taken apart: sequence s holds tokens [s T, (s + 1) T) of the batch.
std::vector<double> sums_apart(const Tensor& probs, const Tensor& ids, bool normalize,
                               int64_t first_token) {
  std::vector<double> sums(kSequences * 2 * kExperts, 0.0);
  for (int64_t t = 0; t < probs.dim(0); ++t) {
    const int64_t s = (first_token + t) / kSeqLen;
    const float* p = probs.data<float>() + t * kExperts;
    double total = 0;
    for (int e = 0; e < kExperts; ++e) total += p[e];
    for (int j = 0; j < kTopK; ++j) {
      const int32_t e = ids.data<int32_t>()[t * kTopK + j];
      if (e >= 0) sums[s * 2 * kExperts + e] += 1;
    }
    for (int e = 0; e < kExperts; ++e)
      sums[s * 2 * kExperts + kExperts + e] += p[e] / (normalize ? total : 1.0);
  }
  return sums;
}

TEST(SequenceAuxSums, MatchSumsTakenApartForEveryRowSplit) {
  for (bool normalize : {false, true}) {
    const Tensor probs = random_scores(kTokens, !normalize, 3);
    const Tensor ids = random_ids(kTokens, 4);
    // Rows [0, cut) on one rank and [cut, n) on another, cut inside a sequence or not:
    // each rank's sums added give the whole batch's.
    for (int64_t cut : {int64_t{0}, int64_t{7}, kSeqLen}) {
      Tensor both = Tensor::zeros({kSequences, 2 * kExperts}, DType::kF32);
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cut}, std::pair{cut, kTokens}}) {
        Tensor part = Tensor::empty({kSequences, 2 * kExperts}, DType::kF32);
        sequence_routing_sums(cpu_device(), probs.slice_rows(begin, end),
                              ids.slice_rows(begin, end), normalize, {begin, kSeqLen}, part);
        const std::vector<double> apart =
            sums_apart(probs.slice_rows(begin, end), ids.slice_rows(begin, end), normalize, begin);
        for (int64_t i = 0; i < part.numel(); ++i) {
          EXPECT_NEAR(part.data<float>()[i], apart[i], 1e-5) << "cut " << cut << " at " << i;
          both.data<float>()[i] += part.data<float>()[i];
        }
      }
      const std::vector<double> whole = sums_apart(probs, ids, normalize, 0);
      for (int64_t i = 0; i < both.numel(); ++i) EXPECT_NEAR(both.data<float>()[i], whole[i], 1e-5);
    }
  }
}

testing::SmallLayerConfig make_setup(testing::Routing routing) {
  return testing::small_layer_config(routing, /*capacity_factor=*/0, /*seq_aux_loss_coef=*/1.0f);
}

// The loss computed apart in double from the router weights W (E, hidden) and the
// tokens x: logits, softmax probabilities or sigmoid scores, each token's top-k by score,
// then the mean over sequences of E / (k T) sum_e selections_e * mean normalised score.
// `selections` receives the chosen experts, so a caller can tell that a step kept them.
double reference_loss(const std::vector<double>& w, const Tensor& x, bool sigmoid,
                      std::vector<int>* selections = nullptr) {
  double loss = 0;
  for (int64_t s = 0; s < kSequences; ++s) {
    std::vector<double> count(kExperts, 0.0), score_sum(kExperts, 0.0);
    for (int64_t t = s * kSeqLen; t < (s + 1) * kSeqLen; ++t) {
      std::vector<double> score(kExperts);
      for (int e = 0; e < kExperts; ++e) {
        double logit = 0;
        for (int64_t h = 0; h < kHidden; ++h)
          logit += w[e * kHidden + h] * x.data<float>()[t * kHidden + h];
        score[e] = sigmoid ? 1 / (1 + std::exp(-logit)) : std::exp(logit);
      }
      const double total = std::accumulate(score.begin(), score.end(), 0.0);
      std::vector<int> order(kExperts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return score[a] > score[b]; });
      for (int j = 0; j < kTopK; ++j) {
        count[order[j]] += 1;
        if (selections) selections->push_back(order[j]);
      }
      for (int e = 0; e < kExperts; ++e) score_sum[e] += score[e] / total;
    }
    for (int e = 0; e < kExperts; ++e)
      loss += kExperts / static_cast<double>(kTopK * kSeqLen) * count[e] * score_sum[e] / kSeqLen;
  }
  return loss / kSequences;
}

class SequenceAuxLayerTest : public ::testing::TestWithParam<testing::Routing> {};

TEST_P(SequenceAuxLayerTest, LossAndRouterGradientMatchTheReference) {
  const bool sigmoid = GetParam().score_function == config::SIGMOID;
  const testing::SmallLayerConfig setup = make_setup(GetParam());
  ParamStore params;
  MoeLayer layer(params, "mlp.", setup.model, setup.moe, nullptr);
  params.allocate(cpu_device());
  params.initialize(21);
  const Tensor x = testing::normal_tensor({kTokens, kHidden}, 22);
  RouterStats stats;
  stats.begin(cpu_device(), 1);
  Rng rng(1);
  layer.forward(cpu_device(), x, /*training=*/true, rng, stats, kSeqLen);
  stats.collect();

  Param* router = params.find("mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  std::vector<double> w(router->value.data<float>(),
                        router->value.data<float>() + router->value.numel());
  std::vector<int> chosen;
  const double expected = reference_loss(w, x, sigmoid, &chosen);
  EXPECT_NEAR(stats.seq_aux_loss, expected, 1e-5 * expected);
  EXPECT_NEAR(stats.layers[0].sequence_aux_loss, expected, 1e-5 * expected);
  EXPECT_GT(expected, 1.0);  // above balance: the sums are not vacuous

  // Only the sequence-wise loss reaches the router: no output gradient, no other loss.
  const Tensor dy = Tensor::zeros({kTokens, kHidden}, DType::kF32);
  const Tensor no_aux = Tensor::zeros({kExperts}, DType::kF32);
  const float coef = 0.5f;
  layer.backward(cpu_device(), dy, no_aux, /*z_loss_scale=*/0, coef);
  const double eps = 1e-4;
  for (size_t i = 0; i < w.size(); ++i) {
    std::vector<std::vector<int>> chosen_up_down;
    const double numeric = coef * testing::central_difference(w[i], eps, [&] {
      return reference_loss(w, x, sigmoid, &chosen_up_down.emplace_back());
    });
    // The step keeps every choice: the loss is smooth here.
    ASSERT_EQ(chosen_up_down, (std::vector<std::vector<int>>{chosen, chosen}));
    EXPECT_NEAR(router->grad.data<float>()[i], numeric, 1e-4 + 1e-3 * std::abs(numeric)) << i;
  }
  double norm = 0;
  for (int64_t i = 0; i < router->grad.numel(); ++i)
    norm += std::abs(router->grad.data<float>()[i]);
  EXPECT_GT(norm, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Gatings, SequenceAuxLayerTest,
                         ::testing::Values(testing::kSoftmaxRenormalized, testing::kSoftmax,
                                           testing::kSigmoid));

// A micro-batch stashed while another runs its forward and backward (pipeline schedules)
// gets back its own sequence sums: its router gradient is the one it has alone.
TEST(SequenceAuxLayer, StashKeepsEachMicroBatchsSums) {
  const testing::SmallLayerConfig setup = make_setup(testing::kSoftmaxRenormalized);
  ParamStore params;
  MoeLayer layer(params, "mlp.", setup.model, setup.moe, nullptr);
  params.allocate(cpu_device());
  params.initialize(21);
  Param* router = params.find("mlp.gate.weight");
  const Tensor dy = Tensor::zeros({kTokens, kHidden}, DType::kF32);
  const Tensor no_aux = Tensor::zeros({kExperts}, DType::kF32);
  auto forward = [&](const Tensor& x) {
    RouterStats stats;
    stats.begin(cpu_device(), 1);
    Rng rng(1);
    layer.forward(cpu_device(), x, /*training=*/true, rng, stats, kSeqLen);
    stats.collect();
  };
  auto router_grad = [&]() {
    std::vector<float> g(router->grad.data<float>(),
                         router->grad.data<float>() + router->grad.numel());
    router->grad.zero_();
    return g;
  };
  const Tensor first = testing::normal_tensor({kTokens, kHidden}, 22);
  const Tensor second = testing::normal_tensor({kTokens, kHidden}, 23, 3.0);
  forward(first);
  layer.backward(cpu_device(), dy, no_aux, 0, 1.0f);
  const std::vector<float> alone = router_grad();

  forward(first);
  MoeLayer::Stash saved = layer.stash();
  forward(second);
  layer.backward(cpu_device(), dy, no_aux, 0, 1.0f);
  const std::vector<float> other = router_grad();
  layer.restore(std::move(saved));
  layer.backward(cpu_device(), dy, no_aux, 0, 1.0f);
  EXPECT_EQ(router_grad(), alone);
  EXPECT_NE(other, alone);
}

TEST(SequenceAuxLayer, OffWithoutTheCoefficient) {
  testing::SmallLayerConfig setup = make_setup(testing::kSoftmaxRenormalized);
  setup.moe.set_seq_aux_loss_coef(0);
  ParamStore params;
  MoeLayer layer(params, "mlp.", setup.model, setup.moe, nullptr);
  params.allocate(cpu_device());
  params.initialize(21);
  RouterStats stats;
  stats.begin(cpu_device(), 1);
  Rng rng(1);
  layer.forward(cpu_device(), testing::normal_tensor({kTokens, kHidden}, 22), true, rng, stats,
                kSeqLen);
  stats.collect();
  EXPECT_EQ(stats.seq_aux_loss, 0.0);
  EXPECT_FALSE(stats.sequence_sums.defined());
}

TEST(SequenceAuxRecipe, RefusesANegativeOrNonFiniteCoefficient) {
  const std::string base = R"(
    name: "seq-aux"
    model { vocab_size: 64 hidden_size: 16 num_layers: 2 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 init_std: 0.02 }
    moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 12 gating: TOP_K }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 8 steps: 1 }
    data { dataset: "data" }
  )";
  auto recipe = config::parse_recipe(base, "seq-aux");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  ASSERT_TRUE(config::apply_override(*recipe, "moe.seq_aux_loss_coef=0.0001").ok());
  EXPECT_TRUE(config::validate_recipe(*recipe).ok()) << config::validate_recipe(*recipe);
  config::Recipe negative = *recipe;
  ASSERT_TRUE(config::apply_override(negative, "moe.seq_aux_loss_coef=-0.5").ok());
  const absl::Status status = config::validate_recipe(negative);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("moe.seq_aux_loss_coef"), std::string::npos) << status;
  EXPECT_NE(status.message().find("must be >= 0 and finite"), std::string::npos) << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status;
  // A non-finite value never reaches validation: the override's number parser refuses it.
  for (const char* value : {"nan", "inf"}) {
    config::Recipe r = *recipe;
    const absl::Status refused =
        config::apply_override(r, std::string("moe.seq_aux_loss_coef=") + value);
    EXPECT_FALSE(refused.ok()) << value;
    EXPECT_NE(refused.message().find("moe.seq_aux_loss_coef"), std::string::npos) << refused;
  }
}

}  // namespace
}  // namespace switchyard
