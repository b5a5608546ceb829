#include "moe/balance_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace switchyard {
namespace {

// A routing with uniform probabilities and zero logits over `experts`.
RoutingSample make_sample(int experts, int k, std::vector<int32_t> ids,
                          std::vector<float> weights) {
  RoutingSample s;
  s.tokens = static_cast<int64_t>(ids.size()) / k;
  s.expert_ids = std::move(ids);
  s.weights = std::move(weights);
  s.probs.assign(s.tokens * experts, 1.0f / experts);
  s.logits.assign(s.tokens * experts, 0.0f);
  return s;
}

TEST(BalanceStats, UniformRouting) {
  BalanceCounts c = make_balance_counts(4, 1, 1);
  add_routing(make_sample(4, 1, {0, 1, 2, 3, 0, 1, 2, 3}, std::vector<float>(8, 1.0f)), c);
  const BalanceSummary s = summarize_balance(c, 16);
  EXPECT_EQ(s.tokens_per_expert, (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_DOUBLE_EQ(s.imbalance, 1.0);
  EXPECT_DOUBLE_EQ(s.cv, 0.0);
  EXPECT_NEAR(s.entropy, std::log(4.0), 1e-12);
  EXPECT_NEAR(s.entropy_fraction, 1.0, 1e-12);
  for (double d : s.dropped) EXPECT_EQ(d, 0.0);
  EXPECT_NEAR(s.aux_loss, 1.0, 1e-6);  // a perfect balance gives top_k
  EXPECT_NEAR(s.z_loss, std::log(4.0) * std::log(4.0), 1e-9);
  EXPECT_FALSE(s.has_all_to_all);
}

TEST(BalanceStats, OneHotExpert) {
  BalanceCounts c = make_balance_counts(4, 1, 1);
  add_routing(make_sample(4, 1, std::vector<int32_t>(8, 0),
                          {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f}),
              c);
  const BalanceSummary s = summarize_balance(c, 16);
  EXPECT_DOUBLE_EQ(s.imbalance, 4.0);
  EXPECT_DOUBLE_EQ(s.entropy, 0.0);
  EXPECT_NEAR(s.cv, std::sqrt(3.0), 1e-12);  // loads 8,0,0,0: std sqrt(12), mean 2
  // Capacities ceil(cf * 8 / 4): 2, 3, 3, 4 of the 8 assignments are kept.
  ASSERT_EQ(s.dropped.size(), 4u);
  EXPECT_DOUBLE_EQ(s.dropped[0], 6.0 / 8);
  EXPECT_DOUBLE_EQ(s.dropped[1], 5.0 / 8);
  EXPECT_DOUBLE_EQ(s.dropped[2], 5.0 / 8);
  EXPECT_DOUBLE_EQ(s.dropped[3], 4.0 / 8);
}

TEST(BalanceStats, CapacityOverflowIsCountedPerBatch) {
  BalanceCounts c = make_balance_counts(2, 1, 1);
  // Expert 0 gets 3 of 4 tokens: capacity ceil(1.0 * 4 / 2) = 2 drops one, 1.25 and up
  // (capacity 3 or more) drop none.
  const RoutingSample sample = make_sample(2, 1, {0, 0, 0, 1}, {0.9f, 0.6f, 0.7f, 0.8f});
  add_routing(sample, c);
  add_routing(sample, c);
  const BalanceSummary s = summarize_balance(c, 16);
  EXPECT_EQ(s.tokens_per_expert, (std::vector<int64_t>{6, 2}));
  EXPECT_DOUBLE_EQ(s.dropped[0], 2.0 / 8);
  EXPECT_DOUBLE_EQ(s.dropped[1], 0.0);
  EXPECT_DOUBLE_EQ(s.dropped[3], 0.0);
  EXPECT_DOUBLE_EQ(s.imbalance, 1.5);
}

TEST(BalanceStats, AllToAllBytes) {
  // 4 experts over 2 ranks (0-1 on rank 0, 2-3 on rank 1); tokens 0-1 on rank 0.
  BalanceCounts c = make_balance_counts(4, 2, 2);
  add_routing(make_sample(4, 2, {0, 2, 2, 3, 0, 3, 3, 2}, std::vector<float>(8, 0.5f)), c);
  const BalanceSummary s = summarize_balance(c, 8);
  ASSERT_TRUE(s.has_all_to_all);
  // Rank 0 sends 1 + 2 rows, rank 1 sends 1; a row is 8 bf16 values.
  EXPECT_EQ(s.all_to_all.sent_bytes, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(s.all_to_all.received_bytes, (std::vector<int64_t>{16, 48}));
  EXPECT_DOUBLE_EQ(s.all_to_all.sent_imbalance, 1.5);
  EXPECT_DOUBLE_EQ(s.all_to_all.received_imbalance, 1.5);
  EXPECT_DOUBLE_EQ(s.all_to_all.imbalance, 1.5);
}

TEST(BalanceStats, OverallSumsLayers) {
  BalanceCounts a = make_balance_counts(2, 1, 1);
  BalanceCounts b = make_balance_counts(2, 1, 1);
  add_routing(make_sample(2, 1, {0, 0}, {1.0f, 1.0f}), a);
  add_routing(make_sample(2, 1, {1, 1}, {1.0f, 1.0f}), b);
  const BalanceSummary s = summarize_overall({a, b}, 4);
  EXPECT_EQ(s.tokens_per_expert, (std::vector<int64_t>{2, 2}));
  EXPECT_DOUBLE_EQ(s.imbalance, 1.0);
  // Each layer alone drops 1 of 2 at capacity 1; together 2 of 4.
  EXPECT_DOUBLE_EQ(s.dropped[0], 0.5);
  // z-loss adds the layers' means: 2 * ln(2)^2.
  EXPECT_NEAR(s.z_loss, 2 * std::log(2.0) * std::log(2.0), 1e-9);
  EXPECT_NEAR(s.aux_loss, 1.0, 1e-6);
}

}  // namespace
}  // namespace switchyard
