// Replica slots for hot experts (issue 35): each of the P expert-parallel ranks holds its
// E/P experts of a placement and K slots more, each a copy of another rank's expert, and
// a replicated expert's assignments split between its copies. The plan is a pure function
// of integer loads, so every rank that plans from the same loads holds the same plan; the
// split is a rule on the dispatch order, so every rank sends each assignment to the same
// copy, on every rerun.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

// One copy of an expert: the rank holding it and its share of the tokens planned from.
struct ExpertCopy {
  int rank = 0;
  int64_t planned_tokens = 0;
};

struct ReplicaPlan {
  int ranks = 1;
  int slots_per_rank = 0;
  // copies[e]: expert e's copies by ascending rank, its owner's among them; one copy for
  // an expert without replicas.
  std::vector<std::vector<ExpertCopy>> copies;
  // replicas[p]: the experts whose copies fill rank p's replica slots, in slot order.
  std::vector<std::vector<int>> replicas;
  // Tokens per rank under the plan, of the loads planned from (balance_stats.h's
  // rank_loads without replicas).
  std::vector<int64_t> rank_tokens;
};

// The most tokens a plan's loads may hold together; every product of two such counts fits
// 128 bits.
inline constexpr int64_t kMaxPlannedTokens = int64_t{1} << 62;

// The plan without replicas, of no tokens: each expert's one copy on the rank its placement
// gives it (balance_stats.h: rank p holds the experts at positions [p * E/P, (p+1) * E/P)
// of `placement`). The placement must be a permutation and `ranks` divide the experts.
ReplicaPlan owner_plan(const std::vector<int>& placement, int ranks);

// The most replica slots a rank may have: as many as the experts it owns, and no more than
// the experts other ranks own.
int max_replica_slots(int num_experts, int ranks);

// Fills up to `slots_per_rank` replica slots per rank so that the busiest rank's tokens
// (`loads[e]`: expert e's tokens) fall. Greedy, in integers, one move at a time, each
// relieving the busiest rank (ties: the lower rank) and taken only where it lowers the
// ranks' tokens sorted busiest first (compared from the busiest on): the one that lowers
// them most of spreading a replicated expert of that rank anew over its copies (no slot
// taken; at most E + P K of them) and of copying one of its experts to the least-loaded
// rank with a free slot (ties: the lower rank); ties go to the spread, then to the lower
// expert. A spread evens out the expert's ranks (water filling; the lower rank first
// where units are left over). So no rank holds two copies of an expert or more than K
// replicas, and the busiest load never exceeds the placement's. `placement` empty:
// contiguous.
// Refuses (one line) loads that are negative or sum past kMaxPlannedTokens, a placement
// that is not a permutation of the experts, ranks that do not divide them, and K outside
// [0, max_replica_slots].
absl::StatusOr<ReplicaPlan> plan_replicas(const std::vector<int64_t>& loads,
                                          const std::vector<int>& placement, int ranks,
                                          int slots_per_rank);

// How an expert's `n` assignments of one dispatch split between its copies: taken in
// dispatch order (source rank, then token, then top-k slot), copy c takes the next
// split[c], the assignments from floor(n * T_c / T) on, where T_c is the planned tokens of
// the copies before c and T all of them (the first copy takes all when T is 0). So a
// dispatch of the planned loads takes exactly the planned split.
std::vector<int64_t> split_assignments(const std::vector<ExpertCopy>& copies, int64_t n);

// The rows of one dispatch under a plan: `assignments[src * E + e]` are source rank src's
// assignments to expert e. Each row goes to the copy split_assignments gives it; a row a
// rank keeps for its own copy crosses no link.
struct DispatchRows {
  std::vector<int64_t> rank_tokens;     // per rank: the rows its copies take
  std::vector<int64_t> sent, received;  // per rank: rows to / from other ranks
};
DispatchRows dispatch_rows(const ReplicaPlan& plan, const std::vector<int64_t>& assignments);

}  // namespace switchyard
