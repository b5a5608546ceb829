// RouterStats over one forward: the MoE layers' device rows (selections, probability
// sums, z-loss sum, kept assignments) read back once by collect(), and the losses and
// load figures made from them.
#include "moe/router_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace switchyard {
namespace {

void fill(Tensor row, const std::vector<float>& values) {
  ASSERT_EQ(row.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), row.data<float>());
}

TEST(RouterStatsTest, CollectSumsTheLayersRows) {
  RouterStats stats;
  stats.begin(cpu_device(), /*moe_layers=*/2);
  // Layer 0: 4 tokens, one assignment dropped (expert 0 kept 2 of 3); layer 1: 2 tokens.
  // 3 experts, top-2; the layers say their capacity factors.
  fill(stats.add_layer(4, 3, 2, 1.25f), {3, 4, 1, 1.5f, 2.0f, 0.5f, 8.0f, 2, 4, 1});
  fill(stats.add_layer(2, 3, 2, 0.0f), {2, 1, 1, 0.6f, 0.9f, 0.5f, 3.0f, 2, 1, 1});
  stats.collect();

  ASSERT_EQ(stats.layers.size(), 2u);
  EXPECT_EQ(stats.layers[0].selections_per_expert, (std::vector<double>{3, 4, 1}));
  EXPECT_EQ(stats.layers[1].prob_sum_per_expert[1], 0.9f);
  EXPECT_EQ(stats.layers[1].tokens, 2);
  EXPECT_EQ(stats.num_experts, 3);
  EXPECT_EQ(stats.layers[0].top_k, 2);
  EXPECT_EQ(stats.layers[0].capacity_factor, 1.25f);
  EXPECT_EQ(stats.layers[1].capacity_factor, 0.0f);
  EXPECT_EQ(stats.selections_per_expert, (std::vector<double>{5, 5, 2}));
  EXPECT_NEAR(stats.prob_sum_per_expert[0], 2.1, 1e-6);
  EXPECT_EQ(stats.routed_tokens, 6);
  EXPECT_DOUBLE_EQ(stats.z_loss, 8.0 / 4 + 3.0 / 2);  // each layer's mean, summed
  EXPECT_EQ(stats.assignments, 12);
  EXPECT_EQ(stats.dropped_assignments, 1);
  EXPECT_DOUBLE_EQ(stats.worst_load_ratio, 4.0 * 3 / 7);  // layer 0: 4 of 7 kept on one of 3
  // E * sum_e (selections_e / T) (prob_sum_e / T), T = 6.
  EXPECT_NEAR(stats.aux_loss(false), 3 * (5 * 2.1 + 5 * 2.9 + 2 * 1.0) / 36, 1e-6);
  const std::vector<float> g = stats.aux_loss_prob_gradient(0.5, false, 0);
  EXPECT_NEAR(g[0], 0.5 * 3 * 5 / 36, 1e-7);
  EXPECT_NEAR(g[2], 0.5 * 3 * 2 / 36, 1e-7);
  EXPECT_FALSE(stats.device_sums.defined());  // read once, then released
}

TEST(RouterStatsTest, ADenseModelCollectsNothing) {
  RouterStats stats;
  stats.begin(cpu_device(), 0);
  stats.collect();
  EXPECT_TRUE(stats.layers.empty());
  EXPECT_EQ(stats.routed_tokens, 0);
  EXPECT_EQ(stats.aux_loss(false), 0.0);
}

TEST(RouterStatsTest, RefusesRowsThatDoNotMatchTheLayers) {
  RouterStats stats;
  stats.begin(cpu_device(), 1);
  stats.add_layer(4, 3, 2, 0);
  EXPECT_DEATH(stats.add_layer(4, 3, 2, 0), "more MoE layers than begin");
  RouterStats short_stats;
  short_stats.begin(cpu_device(), 2);
  short_stats.add_layer(4, 3, 2, 0);
  EXPECT_DEATH(short_stats.collect(), "one row from every MoE layer");
  RouterStats mixed;
  mixed.begin(cpu_device(), 2);
  mixed.add_layer(4, 3, 2, 0);
  EXPECT_DEATH(mixed.add_layer(4, 4, 2, 0), "the same experts");
}

}  // namespace
}  // namespace switchyard
