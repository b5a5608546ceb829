// The per-layer load that training writes to TensorBoard (moe/balance_stats.h): drops
// from routing counts agree with permute_plan's on the same routing, and the heatmap's
// colour scale and image layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <vector>

#include "moe/balance_stats.h"

namespace switchyard {
namespace {

// n tokens, each choosing k distinct experts with a skew towards low ids.
RoutingSample skewed_sample(int64_t n, int experts, int k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::discrete_distribution<int> pick({8, 5, 3, 2, 1, 1});
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  RoutingSample s;
  s.tokens = n;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < k) {
      const int e = pick(gen) % experts;
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) {
      s.expert_ids.push_back(e);
      s.weights.push_back(weight(gen));
    }
  }
  s.probs.assign(n * experts, 1.0f / experts);
  s.logits.assign(n * experts, 0.0f);
  return s;
}

TEST(LayerLoad, DropsFromCountsMatchPermutePlan) {
  const int experts = 6, k = 2;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const RoutingSample sample = skewed_sample(250, experts, k, seed);
    BalanceCounts counts = make_balance_counts(experts, k, 1);
    add_routing(sample, counts);
    const BalanceSummary summary = summarize_balance(counts, 16);
    const std::vector<double> selections(counts.selections.begin(), counts.selections.end());
    for (size_t i = 0; i < std::size(kBalanceCapacityFactors); ++i) {
      const LayerLoad load = layer_load(selections, sample.tokens, k, kBalanceCapacityFactors[i]);
      EXPECT_DOUBLE_EQ(load.dropped_fraction, summary.dropped[i])
          << "seed " << seed << " cf " << kBalanceCapacityFactors[i];
      EXPECT_EQ(load.tokens_per_expert, summary.tokens_per_expert);
      EXPECT_DOUBLE_EQ(load.imbalance, summary.imbalance);
      for (int e = 0; e < experts; ++e) EXPECT_DOUBLE_EQ(load.share[e], summary.share[e]);
    }
    EXPECT_GT(summary.dropped[0], 0.0) << "the skew overflows capacity factor 1";
  }
}

TEST(LayerLoad, DroplessAndExactCapacity) {
  // 4 tokens, top-1, 2 experts: loads 3 and 1; capacity ceil(cf * 4 / 2).
  const LayerLoad dropless = layer_load({3, 1}, 4, 1, 0.0);
  EXPECT_EQ(dropless.dropped_fraction, 0.0);
  EXPECT_DOUBLE_EQ(dropless.imbalance, 1.5);
  EXPECT_EQ(dropless.share, (std::vector<double>{0.75, 0.25}));
  EXPECT_DOUBLE_EQ(layer_load({3, 1}, 4, 1, 1.0).dropped_fraction, 0.25);  // capacity 2
  EXPECT_DOUBLE_EQ(layer_load({3, 1}, 4, 1, 1.5).dropped_fraction, 0.0);   // capacity 3
  const LayerLoad empty = layer_load({0, 0}, 0, 1, 1.0);
  EXPECT_EQ(empty.imbalance, 0.0);
  EXPECT_EQ(empty.dropped_fraction, 0.0);
}

TEST(LoadColor, Scale) {
  auto rgb = [](double share) {
    const Rgb c = load_color(share, 8);
    return std::vector<int>{c.r, c.g, c.b};
  };
  EXPECT_EQ(rgb(0.0), (std::vector<int>{255, 255, 255}));
  EXPECT_EQ(rgb(1.0 / 8), (std::vector<int>{255, 128, 128}));  // uniform share
  EXPECT_EQ(rgb(1.5 / 8), (std::vector<int>{205, 64, 64}));
  EXPECT_EQ(rgb(2.0 / 8), (std::vector<int>{155, 0, 0}));
  EXPECT_EQ(rgb(0.9), (std::vector<int>{155, 0, 0}));  // saturates
}

TEST(LoadHeatmap, CellsAndGrid) {
  const std::vector<std::vector<double>> shares = {{0.0, 0.5, 0.5}, {1.0, 0.0, 0.0}};
  const int cell = 4;
  const RgbImage image = load_heatmap(shares, cell);
  ASSERT_EQ(image.height, 2 * cell + 1);
  ASSERT_EQ(image.width, 3 * cell + 1);
  ASSERT_EQ(image.rgb.size(), size_t(image.height * image.width * 3));
  auto pixel = [&](int y, int x) {
    const uint8_t* p = &image.rgb[(y * image.width + x) * 3];
    return std::vector<int>{p[0], p[1], p[2]};
  };
  const std::vector<int> grey = {204, 204, 204};
  for (int x = 0; x < image.width; ++x) {
    EXPECT_EQ(pixel(0, x), grey);
    EXPECT_EQ(pixel(cell, x), grey);
    EXPECT_EQ(pixel(2 * cell, x), grey);
  }
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 3; ++e) {
      const Rgb c = load_color(shares[l][e], 3);
      for (int y = l * cell + 1; y < (l + 1) * cell; ++y)
        for (int x = e * cell + 1; x < (e + 1) * cell; ++x)
          EXPECT_EQ(pixel(y, x), (std::vector<int>{c.r, c.g, c.b})) << l << " " << e;
    }
  }
  EXPECT_EQ(load_heatmap({}, cell).height, 0);
}

}  // namespace
}  // namespace switchyard
