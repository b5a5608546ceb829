// Padded windows through the whole model (Transformer::forward's window_tokens): a batch
// of two conversations, the first padded, routes and scores as the two conversations run
// alone at their own lengths. The routing statistics count only the real tokens (the
// selections and probability sums are the two runs' added, the z-loss their token-weighted
// mean), and with the cross-entropy as the only loss the padded batch's gradients are the
// two runs' summed as the trainer weights them (one denominator for the step's targets).
#include <gtest/gtest.h>

#include <vector>

#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tests/model/pipeline_test_util.h"

namespace switchyard {
namespace {

using pipeline_test::kBatch;
using pipeline_test::kSeq;

constexpr int32_t kFirstLength = 7;  // the first conversation; the second fills its window

// The first window cut to kFirstLength tokens and padded as TokenDataset pads it.
pipeline_test::MicroBatch padded_batch() {
  pipeline_test::MicroBatch m = pipeline_test::micro_batch(9, /*documents=*/false);
  for (int64_t i = kFirstLength; i < kSeq; ++i) m.ids.data<int32_t>()[i] = 0;
  for (int64_t i = kFirstLength - 1; i < kSeq; ++i) m.targets.data<int32_t>()[i] = -1;
  return m;
}

Tensor window(const Tensor& t, int64_t w, int64_t length) {
  Tensor out = Tensor::empty({1, length}, DType::kI32);
  for (int64_t i = 0; i < length; ++i) out.data<int32_t>()[i] = t.data<int32_t>()[w * kSeq + i];
  return out;
}

double targets_of(const Tensor& targets) {
  double n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += targets.data<int32_t>()[i] >= 0;
  return n;
}

struct Model {
  explicit Model(const config::Recipe& recipe) : model(recipe, params) {
    params.allocate(cpu_device());
    params.initialize(5);
    refresh_working_copies(cpu_device(), params);
  }
  ParamStore params;
  Transformer model;
};

config::Recipe recipe_with(const std::string& moe) {
  pipeline_test::Case c{"padded", "", "num_experts: 4 top_k: 2 gating: TOP_K " + moe, "",
                        false};
  return pipeline_test::recipe_for(c, 2);
}

TEST(PaddedRoutingTest, RoutingStatisticsCountOnlyTheRealTokens) {
  const config::Recipe recipe = recipe_with("aux_loss_coef: 0.1 z_loss_coef: 0.01");
  const pipeline_test::MicroBatch m = padded_batch();
  Tensor lengths = Tensor::empty({kBatch}, DType::kI32);
  lengths.data<int32_t>()[0] = kFirstLength;
  lengths.data<int32_t>()[1] = kSeq;
  Model padded(recipe);
  padded.model.forward(cpu_device(), m.ids, m.targets, /*training=*/true, Rng(3), nullptr,
                       Tensor(), lengths);
  const RouterStats& stats = padded.model.router_stats();
  ASSERT_EQ(stats.layers.size(), 2u);
  EXPECT_EQ(stats.routed_tokens, 2 * (kFirstLength + kSeq));

  std::vector<RouterStats> alone;
  for (int64_t w = 0; w < kBatch; ++w) {
    const int64_t length = w == 0 ? kFirstLength : kSeq;
    Model one(recipe);
    one.model.forward(cpu_device(), window(m.ids, w, length), window(m.targets, w, length),
                      /*training=*/true, Rng(3), nullptr);
    alone.push_back(one.model.router_stats());
  }
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    const RouterStats::Layer& got = stats.layers[l];
    const RouterStats::Layer& a = alone[0].layers[l];
    const RouterStats::Layer& b = alone[1].layers[l];
    EXPECT_EQ(got.tokens, a.tokens + b.tokens);
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(got.selections_per_expert[e],
                a.selections_per_expert[e] + b.selections_per_expert[e]);
      EXPECT_NEAR(got.prob_sum_per_expert[e], a.prob_sum_per_expert[e] + b.prob_sum_per_expert[e],
                  1e-5);
    }
    EXPECT_NEAR(got.z_loss, (a.z_loss * a.tokens + b.z_loss * b.tokens) / (a.tokens + b.tokens),
                1e-5 * got.z_loss);
  }
}

TEST(PaddedRoutingTest, GradientsAreTheConversationsAloneSummed) {
  const config::Recipe recipe = recipe_with("aux_loss_coef: 0 z_loss_coef: 0 capacity_factor: 0");
  const pipeline_test::MicroBatch m = padded_batch();
  Tensor lengths = Tensor::empty({kBatch}, DType::kI32);
  lengths.data<int32_t>()[0] = kFirstLength;
  lengths.data<int32_t>()[1] = kSeq;
  const double step_targets = targets_of(m.targets);
  Model padded(recipe);
  const LossParts whole = padded.model.forward(cpu_device(), m.ids, m.targets, /*training=*/true,
                                               Rng(3), nullptr, Tensor(), lengths);
  padded.model.backward(cpu_device(), 1.0f, step_targets);

  Model alone(recipe);
  double cross_entropy_sum = 0;
  for (int64_t w = 0; w < kBatch; ++w) {
    const int64_t length = w == 0 ? kFirstLength : kSeq;
    const Tensor targets = window(m.targets, w, length);
    const LossParts part = alone.model.forward(cpu_device(), window(m.ids, w, length), targets,
                                               /*training=*/true, Rng(3), nullptr);
    cross_entropy_sum += part.cross_entropy * targets_of(targets);
    alone.model.backward(cpu_device(), 1.0f, step_targets);
  }
  EXPECT_NEAR(whole.cross_entropy, cross_entropy_sum / step_targets, 1e-5);
  const auto& got = padded.params.params();
  const auto& expected = alone.params.params();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const Tensor a = got[i].grad.on_host(), b = expected[i].grad.on_host();
    for (int64_t j = 0; j < a.numel(); ++j)
      ASSERT_NEAR(a.data<float>()[j], b.data<float>()[j], 1e-5) << got[i].name << " at " << j;
  }
}

}  // namespace
}  // namespace switchyard
