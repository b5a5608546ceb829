// Loss-free balancing: the bias update from a step's loads (every micro-batch summed
// first), and its application to the rows of the bias a rank holds.
#include "moe/expert_bias.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/comm/local_communicator.h"

namespace switchyard {
namespace {

RouterStats stats_of(const std::vector<std::vector<double>>& layer_loads) {
  RouterStats stats;
  stats.reset(static_cast<int>(layer_loads[0].size()));
  for (const std::vector<double>& loads : layer_loads)
    stats.layers.push_back({.selections_per_expert = loads, .prob_sum_per_expert = loads});
  return stats;
}

TEST(ExpertBiasTest, UpdateMovesTowardsTheMeanByTheRate) {
  // Mean 3: the overloaded expert goes down, the idle ones up, the one at the mean stays.
  EXPECT_EQ(bias_update({6, 3, 0, 1, 5}, 0.25f),
            (std::vector<float>{-0.25f, 0.0f, 0.25f, 0.25f, -0.25f}));
}

// A step's update follows the step's whole load: two micro-batches that are each
// skewed the other way add up to a balance that moves nothing.
TEST(ExpertBiasTest, SumsEveryMicroBatchBeforeTheUpdate) {
  LocalCommunicator one;
  ExpertBiasBalancer balancer(0.5f, 3);
  balancer.add(stats_of({{4, 1, 1}, {2, 2, 2}}));
  balancer.add(stats_of({{0, 3, 3}, {3, 2, 1}}));
  const std::vector<std::vector<float>> updates = balancer.take_updates(one);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0], (std::vector<float>{0.0f, 0.0f, 0.0f}));  // loads 4, 4, 4
  EXPECT_EQ(updates[1], (std::vector<float>{-0.5f, 0.0f, 0.5f}));  // loads 5, 4, 3
  // The next step starts from nothing (with the last step's loads, 6, 6, 6 would stay).
  balancer.add(stats_of({{2, 2, 2}, {1, 2, 3}}));
  EXPECT_EQ(balancer.take_updates(one)[1], (std::vector<float>{0.5f, 0.0f, -0.5f}));
}

TEST(ExpertBiasTest, AddsTheUpdateToTheRowsHeld) {
  const std::vector<float> update = {1.0f, -1.0f, 0.5f, 0.0f};
  Tensor rows = Tensor::zeros({2});
  rows.data<float>()[0] = 0.25f;
  add_bias_update(rows, /*first_row=*/2, update);  // a ZeRO-3 replica's rows 2 and 3
  EXPECT_EQ(rows.data<float>()[0], 0.75f);
  EXPECT_EQ(rows.data<float>()[1], 0.0f);
  Tensor outside = Tensor::zeros({2});
  EXPECT_DEATH(add_bias_update(outside, 3, update), "outside the bias");
}

}  // namespace
}  // namespace switchyard
