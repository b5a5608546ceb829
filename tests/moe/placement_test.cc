// Expert placement advice: per-rank tokens under a placement, and the greedy assignment
// against an exhaustive search over every placement of small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/runtime/rng.h"
#include "moe/balance_stats.h"

namespace switchyard {
namespace {

// The least busiest-rank load over every placement of E experts on P ranks (E/P each).
int64_t best_max(const std::vector<int64_t>& loads, int ranks) {
  std::vector<int> placement(loads.size());
  std::iota(placement.begin(), placement.end(), 0);
  int64_t best = INT64_MAX;
  do {
    const std::vector<int64_t> per_rank = rank_loads(loads, placement, ranks);
    best = std::min(best, *std::max_element(per_rank.begin(), per_rank.end()));
  } while (std::next_permutation(placement.begin(), placement.end()));
  return best;
}

TEST(PlacementTest, RankLoadsFollowThePlacement) {
  const std::vector<int64_t> loads = {10, 1, 7, 2};
  EXPECT_EQ(rank_loads(loads, {0, 1, 2, 3}, 2), (std::vector<int64_t>{11, 9}));
  EXPECT_EQ(rank_loads(loads, {0, 3, 1, 2}, 2), (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(rank_loads(loads, {2, 0, 3, 1}, 4), (std::vector<int64_t>{7, 10, 2, 1}));
}

TEST(PlacementTest, SeparatesTheHotExpertsThatContiguousRanksShare) {
  // Experts 0 and 1 are hot and share rank 0 in the contiguous placement; the best any
  // placement can do is the hottest with three of the others.
  const PlacementAdvice a = advise_placement({50, 40, 5, 5, 5, 5, 5, 5}, 2);
  EXPECT_EQ(a.contiguous_max, 100);
  EXPECT_EQ(a.advised_max, 65);
  EXPECT_EQ(a.lower_bound, 65);
  EXPECT_EQ(a.advised_loads, rank_loads({50, 40, 5, 5, 5, 5, 5, 5}, a.placement, 2));
  std::vector<int> sorted = a.placement;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(PlacementTest, KeepsTheContiguousPlacementWhenNothingBeatsIt) {
  const PlacementAdvice a = advise_placement({4, 4, 4, 4}, 2);
  EXPECT_EQ(a.placement, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(a.advised_max, a.contiguous_max);
  const PlacementAdvice one = advise_placement({3, 9, 1}, 1);
  EXPECT_EQ(one.advised_max, 13);
  EXPECT_EQ(one.lower_bound, 13);
}

TEST(PlacementTest, NeverWorseThanContiguousAndWithinItsBoundOfTheBest) {
  Rng rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int ranks = trial % 2 == 0 ? 2 : 4;
    std::vector<int64_t> loads(8);
    for (int64_t& l : loads) l = static_cast<int64_t>(rng.uniform() * 1000);
    const PlacementAdvice a = advise_placement(loads, ranks);
    const int64_t best = best_max(loads, ranks);
    EXPECT_LE(a.advised_max, a.contiguous_max);
    EXPECT_GE(a.advised_max, best);
    EXPECT_LE(a.lower_bound, best);
    // Greedy with equal expert counts: within 4/3 of the best placement on these cases.
    EXPECT_LE(3 * a.advised_max, 4 * best) << "trial " << trial;
  }
}

}  // namespace
}  // namespace switchyard
