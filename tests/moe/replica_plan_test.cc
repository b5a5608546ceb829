// Replica planning for hot experts: hand-computed plans, the invariants every plan keeps
// (each expert's tokens split once over its copies, at most K replicas a rank, none on the
// owner's rank, the busiest rank never busier than without), determinism, the split rule
// of a dispatch, and the refusals of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/runtime/rng.h"
#include "moe/balance_stats.h"
#include "moe/replica_plan.h"

namespace switchyard {
namespace {

std::vector<int> identity(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

int64_t max_of(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(ReplicaPlanTest, CopiesTheHotExpertToTheIdleRank) {
  // Rank 0 holds 50 + 40 + 5 + 5, rank 1 the other 20. A copy of expert 0 on rank 1 evens
  // them at 60 (expert 1's would too, but no better: the lower expert wins).
  const ReplicaPlan plan = *plan_replicas({50, 40, 5, 5, 5, 5, 5, 5}, {}, 2, 1);
  EXPECT_EQ(plan.rank_tokens, (std::vector<int64_t>{60, 60}));
  ASSERT_EQ(plan.copies[0].size(), 2u);
  EXPECT_EQ(plan.copies[0][0].rank, 0);
  EXPECT_EQ(plan.copies[0][0].planned_tokens, 10);
  EXPECT_EQ(plan.copies[0][1].rank, 1);
  EXPECT_EQ(plan.copies[0][1].planned_tokens, 40);
  EXPECT_EQ(plan.replicas, (std::vector<std::vector<int>>{{}, {0}}));
}

TEST(ReplicaPlanTest, SpreadsOneExpertOverEveryRankToTheMean) {
  // One expert per rank, loads 9, 3, 3, 1: rank 3 takes a copy of expert 0 (5 and 4),
  // then rank 1 (0: 5, 1: 1, 3: 3, leaving rank 0 alone at the top), then rank 2 brings
  // every rank to the mean, 4.
  const ReplicaPlan plan = *plan_replicas({9, 3, 3, 1}, {}, 4, 1);
  EXPECT_EQ(plan.rank_tokens, (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(plan.replicas, (std::vector<std::vector<int>>{{}, {0}, {0}, {0}}));
  std::vector<int64_t> split;
  for (const ExpertCopy& c : plan.copies[0]) split.push_back(c.planned_tokens);
  EXPECT_EQ(split, (std::vector<int64_t>{4, 1, 1, 3}));
}

TEST(ReplicaPlanTest, WeighsTheRanksBehindTheBusiest) {
  // Ranks 0 (experts 2 + 8) and 1 (10 + 0) tie at 10. Either copy from rank 0 leaves rank 1
  // at 10; the copy of expert 1 leaves the rest lower (5, 5 against 8, 2), and rank 1's
  // copy then brings every rank to 5. The lower expert alone would have ended at 7.
  const ReplicaPlan plan = *plan_replicas({2, 8, 10, 0, 0, 0, 0, 0}, {}, 4, 1);
  EXPECT_EQ(plan.rank_tokens, (std::vector<int64_t>{5, 5, 5, 5}));
  EXPECT_EQ(plan.replicas, (std::vector<std::vector<int>>{{}, {}, {1}, {2}}));
}

TEST(ReplicaPlanTest, FollowsThePlacement) {
  // Placement [0, 3 | 1, 2]: rank 0 holds experts 0 and 3 (12), rank 1 experts 1 and 2 (8).
  const ReplicaPlan plan = *plan_replicas({10, 1, 7, 2}, {0, 3, 1, 2}, 2, 1);
  EXPECT_EQ(plan.rank_tokens, (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(plan.replicas, (std::vector<std::vector<int>>{{}, {0}}));
  EXPECT_EQ(plan.copies[0][0].planned_tokens, 8);
  EXPECT_EQ(plan.copies[0][1].planned_tokens, 2);
  EXPECT_EQ(plan.copies[2][0].rank, 1);
}

TEST(ReplicaPlanTest, LeavesABalancedLoadAlone) {
  const ReplicaPlan plan = *plan_replicas({5, 5, 5, 5}, {}, 2, 2);
  EXPECT_EQ(plan.rank_tokens, (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(plan.replicas, (std::vector<std::vector<int>>{{}, {}}));
  const ReplicaPlan none = *plan_replicas({7, 0, 3, 1}, {}, 2, 0);
  EXPECT_EQ(none.rank_tokens, rank_loads({7, 0, 3, 1}, identity(4), 2));
}

TEST(ReplicaPlanTest, SplitsAnExpertsAssignmentsInDispatchOrder) {
  const std::vector<ExpertCopy> copies = {{0, 10}, {1, 40}};
  EXPECT_EQ(split_assignments(copies, 50), (std::vector<int64_t>{10, 40}));
  EXPECT_EQ(split_assignments(copies, 5), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(split_assignments(copies, 7), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(split_assignments(copies, 0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(split_assignments({{3, 0}}, 9), (std::vector<int64_t>{9}));
  // Counts near the limit: the products need 128 bits.
  const int64_t big = kMaxPlannedTokens;
  EXPECT_EQ(split_assignments({{0, big / 2}, {1, big / 2}}, big),
            (std::vector<int64_t>{big / 2, big / 2}));
}

TEST(ReplicaPlanTest, DispatchSendsEachRowToItsCopy) {
  // Expert 0 on rank 0 with a copy on rank 1 taking 40 of 50; expert 1 on rank 1 alone.
  ReplicaPlan plan = owner_plan({0, 1}, 2);
  plan.copies[0] = {{0, 10}, {1, 40}};
  // Rank 0 routes 30 assignments to expert 0 and 2 to expert 1, rank 1 20 and 3.
  const DispatchRows rows = dispatch_rows(plan, {30, 2, 20, 3});
  // Expert 0's first 10 (rank 0's) stay on rank 0, its next 20 go from rank 0 to rank 1,
  // and rank 1's 20 stay there; expert 1's 2 from rank 0 cross to rank 1.
  EXPECT_EQ(rows.rank_tokens, (std::vector<int64_t>{10, 45}));
  EXPECT_EQ(rows.sent, (std::vector<int64_t>{22, 0}));
  EXPECT_EQ(rows.received, (std::vector<int64_t>{0, 22}));
}

TEST(ReplicaPlanTest, OwnerPlanSendsEachRowToItsExpertsRank) {
  // Without replicas a row leaves its rank exactly when its expert lives elsewhere.
  const DispatchRows rows = dispatch_rows(owner_plan(identity(4), 2), {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(rows.rank_tokens, (std::vector<int64_t>{1 + 2 + 5 + 6, 3 + 4 + 7 + 8}));
  EXPECT_EQ(rows.sent, (std::vector<int64_t>{3 + 4, 5 + 6}));
  EXPECT_EQ(rows.received, (std::vector<int64_t>{5 + 6, 3 + 4}));
}

// Every plan of random loads, placements, rank counts and slots keeps the invariants.
TEST(ReplicaPlanTest, KeepsItsInvariantsOnRandomLoads) {
  Rng rng(35);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 << (trial % 4);
    const int experts = ranks * (1 + trial % 5);
    const int slots = trial % (max_replica_slots(experts, ranks) + 1);
    std::vector<int64_t> loads(experts);
    for (int64_t& l : loads) l = static_cast<int64_t>(std::pow(rng.uniform(), 4) * 1000);
    std::vector<int> placement = identity(experts);
    for (int i = experts - 1; i > 0; --i)
      std::swap(placement[i], placement[static_cast<int>(rng.uniform() * (i + 1)) % (i + 1)]);
    const ReplicaPlan plan = *plan_replicas(loads, placement, ranks, slots);
    const std::vector<int64_t> without = rank_loads(loads, placement, ranks);
    EXPECT_LE(max_of(plan.rank_tokens), max_of(without)) << "trial " << trial;

    std::vector<int64_t> rank_tokens(ranks, 0);
    std::vector<int> replicas_held(ranks, 0);
    for (int s = 0; s < experts; ++s) {
      const int e = placement[s], owner = s / (experts / ranks);
      const std::vector<ExpertCopy>& copies = plan.copies[e];
      int64_t split = 0;
      bool owned = false;
      for (size_t c = 0; c < copies.size(); ++c) {
        if (c > 0) {
          EXPECT_LT(copies[c - 1].rank, copies[c].rank) << "trial " << trial;
        }
        EXPECT_GE(copies[c].planned_tokens, 0);
        split += copies[c].planned_tokens;
        rank_tokens[copies[c].rank] += copies[c].planned_tokens;
        if (copies[c].rank == owner) {
          owned = true;
        } else {
          ++replicas_held[copies[c].rank];
          const std::vector<int>& held = plan.replicas[copies[c].rank];
          EXPECT_EQ(std::count(held.begin(), held.end(), e), 1) << "trial " << trial;
        }
      }
      EXPECT_TRUE(owned) << "trial " << trial;
      EXPECT_EQ(split, loads[e]) << "trial " << trial;
    }
    EXPECT_EQ(rank_tokens, plan.rank_tokens) << "trial " << trial;
    for (int p = 0; p < ranks; ++p) {
      EXPECT_LE(replicas_held[p], slots);
      EXPECT_EQ(replicas_held[p], static_cast<int>(plan.replicas[p].size()));
    }

    // Dispatching the planned loads, however the sources share them, takes the planned
    // split, and every row arrives once.
    std::vector<int64_t> by_source(static_cast<size_t>(ranks) * experts, 0);
    for (int e = 0; e < experts; ++e) {
      int64_t left = loads[e];
      for (int src = 0; src + 1 < ranks; ++src) {
        const int64_t part = static_cast<int64_t>(rng.uniform() * static_cast<double>(left + 1));
        by_source[src * experts + e] = std::min(part, left);
        left -= by_source[src * experts + e];
      }
      by_source[(ranks - 1) * experts + e] = left;
    }
    const DispatchRows rows = dispatch_rows(plan, by_source);
    EXPECT_EQ(rows.rank_tokens, plan.rank_tokens) << "trial " << trial;
    EXPECT_EQ(std::accumulate(rows.sent.begin(), rows.sent.end(), int64_t{0}),
              std::accumulate(rows.received.begin(), rows.received.end(), int64_t{0}));

    // The same loads give the same plan.
    const ReplicaPlan again = *plan_replicas(loads, placement, ranks, slots);
    EXPECT_EQ(again.replicas, plan.replicas);
    EXPECT_EQ(again.rank_tokens, plan.rank_tokens);
    for (int e = 0; e < experts; ++e)
      for (size_t c = 0; c < plan.copies[e].size(); ++c)
        EXPECT_EQ(again.copies[e][c].planned_tokens, plan.copies[e][c].planned_tokens);
  }
}

TEST(ReplicaPlanTest, RefusesBadInputInOneLine) {
  auto message = [](const std::vector<int64_t>& loads, const std::vector<int>& placement,
                    int ranks, int slots) {
    return std::string(plan_replicas(loads, placement, ranks, slots).status().message());
  };
  EXPECT_EQ(message({1, 2, 3}, {}, 2, 1),
            "replica plan: the expert-parallel size 2 must divide the experts (3)");
  EXPECT_EQ(message({}, {}, 1, 0),
            "replica plan: the expert-parallel size 1 must divide the experts (0)");
  EXPECT_EQ(message({1, 2}, {}, 0, 0),
            "replica plan: the expert-parallel size 0 must divide the experts (2)");
  EXPECT_EQ(message({1, 2, 3, 4}, {}, 2, 3),
            "replica plan: 3 replica slots per rank is out of range [0, 2]");
  EXPECT_EQ(message({1, 2, 3, 4}, {}, 2, -1),
            "replica plan: -1 replica slots per rank is out of range [0, 2]");
  EXPECT_EQ(message({1, 2, 3, 4}, {}, 1, 1),
            "replica plan: 1 replica slots per rank is out of range [0, 0]");
  EXPECT_EQ(message({1, -2, 3, 4}, {}, 2, 1),
            "replica plan: expert 1's load -2 is negative or takes the total past "
            "4611686018427387904");
  EXPECT_EQ(message({kMaxPlannedTokens, 1}, {}, 2, 1),
            "replica plan: expert 1's load 1 is negative or takes the total past "
            "4611686018427387904");
  EXPECT_EQ(message({1, 2, 3, 4}, {0, 1, 2}, 2, 1),
            "replica plan: the placement has 3 entries for 4 experts");
  EXPECT_EQ(message({1, 2, 3, 4}, {0, 1, 1, 3}, 2, 1),
            "replica plan: placement[2] (1) is not an expert left to place");
  EXPECT_EQ(message({1, 2, 3, 4}, {0, 1, 4, 3}, 2, 1),
            "replica plan: placement[2] (4) is not an expert left to place");
}

}  // namespace
}  // namespace switchyard
