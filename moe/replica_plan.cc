#include "moe/replica_plan.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/check.h"
#include "core/runtime/status_macros.h"
#include "moe/balance_stats.h"

namespace switchyard {

namespace {

absl::Status check_plan_inputs(const std::vector<int64_t>& loads,
                               const std::vector<int>& placement, int ranks, int slots) {
  const size_t experts = loads.size();
  if (ranks < 1 || experts == 0 || experts > INT_MAX || experts % ranks != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "replica plan: the expert-parallel size ", ranks, " must divide the experts (", experts,
        ")"));
  const int E = static_cast<int>(experts);
  if (slots < 0 || slots > max_replica_slots(E, ranks))
    return absl::InvalidArgumentError(
        absl::StrCat("replica plan: ", slots, " replica slots per rank is out of range [0, ",
                     max_replica_slots(E, ranks), "]"));
  int64_t total = 0;
  for (int e = 0; e < E; ++e) {
    if (loads[e] < 0 || loads[e] > kMaxPlannedTokens - total)
      return absl::InvalidArgumentError(absl::StrCat(
          "replica plan: expert ", e, "'s load ", loads[e], " is negative or takes the total past ",
          kMaxPlannedTokens));
    total += loads[e];
  }
  if (placement.empty()) return absl::OkStatus();
  if (placement.size() != experts)
    return absl::InvalidArgumentError(absl::StrCat("replica plan: the placement has ",
                                                   placement.size(), " entries for ", E,
                                                   " experts"));
  std::vector<bool> seen(E, false);
  for (size_t s = 0; s < placement.size(); ++s) {
    if (placement[s] < 0 || placement[s] >= E || seen[placement[s]])
      return absl::InvalidArgumentError(absl::StrCat(
          "replica plan: placement[", s, "] (", placement[s], ") is not an expert left to place"));
    seen[placement[s]] = true;
  }
  return absl::OkStatus();
}

// The ranks' tokens, busiest first: a plan is better than another when this is smaller,
// compared from the busiest on (the busiest load first, then the next, ...).
std::vector<int64_t> descending(std::vector<int64_t> rank_tokens) {
  std::sort(rank_tokens.begin(), rank_tokens.end(), std::greater<int64_t>());
  return rank_tokens;
}

bool holds(const std::vector<ExpertCopy>& copies, int rank) {
  return std::any_of(copies.begin(), copies.end(),
                     [rank](const ExpertCopy& c) { return c.rank == rank; });
}

// The rank with a free replica slot and the fewest tokens (ties: the lower rank); -1 when
// every slot is taken.
int open_rank(const ReplicaPlan& plan) {
  int open = -1;
  for (int p = 0; p < plan.ranks; ++p)
    if (static_cast<int>(plan.replicas[p].size()) < plan.slots_per_rank &&
        (open < 0 || plan.rank_tokens[p] < plan.rank_tokens[open]))
      open = p;
  return open;
}

// `tokens` spread over ranks that carry `base` tokens each (in copy order) so that the
// busiest of them ends as low as it can: the least-loaded are filled to a common level h,
// the copies with the lower ranks at h and the others at h - 1 where units are short.
std::vector<int64_t> water_fill(const std::vector<int64_t>& base, int64_t tokens) {
  const int n = static_cast<int>(base.size());
  std::vector<int> by_base(n);
  std::iota(by_base.begin(), by_base.end(), 0);
  std::stable_sort(by_base.begin(), by_base.end(), [&](int x, int y) { return base[x] < base[y]; });
  int filled = 0;
  int64_t level = 0, below = 0;  // below: the filled ranks' base tokens
  while (filled < n) {
    below += base[by_base[filled]];
    ++filled;
    level = (tokens + below + filled - 1) / filled;
    if (filled == n || level <= base[by_base[filled]]) break;
  }
  // The filled copies from the highest rank down give back the units the level overshoots.
  std::vector<int> lifted(by_base.begin(), by_base.begin() + filled);
  std::sort(lifted.begin(), lifted.end(), std::greater<int>());
  int64_t surplus = level * filled - tokens - below;
  std::vector<int64_t> share(n, 0);
  for (int c : lifted) {
    share[c] = level - base[c];
    if (surplus > 0) {
      --share[c];
      --surplus;
    }
  }
  return share;
}

// Expert e's tokens spread anew over its copies by water_fill, with a copy more on rank
// `r` (-1: none), and the ranks' tokens with that spread.
struct Trial {
  std::vector<ExpertCopy> copies;
  std::vector<int64_t> rank_tokens;
};

Trial respread(const ReplicaPlan& plan, int e, int r) {
  Trial t{plan.copies[e], plan.rank_tokens};
  if (r >= 0) t.copies.push_back({r, 0});
  std::sort(t.copies.begin(), t.copies.end(),
            [](const ExpertCopy& x, const ExpertCopy& y) { return x.rank < y.rank; });
  int64_t tokens = 0;
  std::vector<int64_t> base;
  for (const ExpertCopy& c : t.copies) {
    tokens += c.planned_tokens;
    t.rank_tokens[c.rank] -= c.planned_tokens;
    base.push_back(t.rank_tokens[c.rank]);
  }
  const std::vector<int64_t> share = water_fill(base, tokens);
  for (size_t c = 0; c < t.copies.size(); ++c) {
    t.copies[c].planned_tokens = share[c];
    t.rank_tokens[t.copies[c].rank] += share[c];
  }
  return t;
}

// A step of the plan: expert `expert` spread anew, with a copy on rank `rank` (-1: none).
struct Move {
  int expert = -1;
  int rank = -1;
  Trial trial;
};

// Of the moves that relieve the busiest rank (ties: the lower rank), the one that leaves
// the ranks' tokens the least (`descending`): a replicated expert of that rank spread anew
// over its copies (when `respread_allowed`; it takes no slot), or a copy of one of its
// experts on rank `open` (-1: none). Ties go to the spread without a new copy, then to the
// lower expert; expert -1 when no move betters the plan.
Move best_move(const ReplicaPlan& plan, int open, bool respread_allowed) {
  const int busiest = static_cast<int>(
      std::max_element(plan.rank_tokens.begin(), plan.rank_tokens.end()) -
      plan.rank_tokens.begin());
  std::vector<int64_t> best = descending(plan.rank_tokens);
  Move move;
  auto consider = [&](int e, int r) {
    Trial t = respread(plan, e, r);
    std::vector<int64_t> loads = descending(t.rank_tokens);
    if (loads < best) {
      best = std::move(loads);
      move = {e, r, std::move(t)};
    }
  };
  const int experts = static_cast<int>(plan.copies.size());
  for (int e = 0; e < experts && respread_allowed; ++e)
    if (plan.copies[e].size() > 1 && holds(plan.copies[e], busiest)) consider(e, -1);
  for (int e = 0; e < experts && open >= 0; ++e)
    if (holds(plan.copies[e], busiest) && !holds(plan.copies[e], open)) consider(e, open);
  return move;
}

}  // namespace

ReplicaPlan owner_plan(const std::vector<int>& placement, int ranks) {
  const int E = static_cast<int>(placement.size());
  SY_CHECK_MSG(ranks > 0 && E % ranks == 0, "owner_plan: the ranks must divide the experts");
  ReplicaPlan plan;
  plan.ranks = ranks;
  plan.copies.resize(E);
  for (int s = 0; s < E; ++s) plan.copies[placement[s]] = {{s / (E / ranks), 0}};
  plan.replicas.resize(ranks);
  plan.rank_tokens.assign(ranks, 0);
  return plan;
}

int max_replica_slots(int num_experts, int ranks) {
  return std::min(num_experts / ranks, num_experts - num_experts / ranks);
}

absl::StatusOr<ReplicaPlan> plan_replicas(const std::vector<int64_t>& loads,
                                          const std::vector<int>& placement, int ranks,
                                          int slots_per_rank) {
  SY_RETURN_IF_ERROR(check_plan_inputs(loads, placement, ranks, slots_per_rank));
  std::vector<int> order = placement;
  if (order.empty()) {
    order.resize(loads.size());
    std::iota(order.begin(), order.end(), 0);
  }
  ReplicaPlan plan = owner_plan(order, ranks);
  plan.slots_per_rank = slots_per_rank;
  for (size_t e = 0; e < loads.size(); ++e) plan.copies[e][0].planned_tokens = loads[e];
  plan.rank_tokens = rank_loads(loads, order, ranks);
  // Each spread anew betters the plan without taking a slot; at most as many as the copies a
  // plan can hold bounds the work whatever the loads.
  int64_t respreads_left =
      static_cast<int64_t>(loads.size()) + static_cast<int64_t>(ranks) * slots_per_rank;
  for (;;) {
    const int open = open_rank(plan);
    Move move = best_move(plan, open, respreads_left > 0);
    if (move.expert < 0) break;
    plan.copies[move.expert] = std::move(move.trial.copies);
    plan.rank_tokens = std::move(move.trial.rank_tokens);
    if (move.rank >= 0) {
      plan.replicas[move.rank].push_back(move.expert);
    } else {
      --respreads_left;
    }
  }
  return plan;
}

std::vector<int64_t> split_assignments(const std::vector<ExpertCopy>& copies, int64_t n) {
  std::vector<int64_t> split(copies.size(), 0);
  int64_t total = 0;
  for (const ExpertCopy& c : copies) total += c.planned_tokens;
  if (total == 0) {
    split[0] = n;
    return split;
  }
  int64_t before = 0, start = 0;
  for (size_t c = 0; c < copies.size(); ++c) {
    before += copies[c].planned_tokens;
    const int64_t end = static_cast<int64_t>(static_cast<__int128>(n) * before / total);
    split[c] = end - start;
    start = end;
  }
  return split;
}

DispatchRows dispatch_rows(const ReplicaPlan& plan, const std::vector<int64_t>& assignments) {
  const int P = plan.ranks;
  const int E = static_cast<int>(plan.copies.size());
  SY_CHECK_MSG(assignments.size() == static_cast<size_t>(P) * E,
               "dispatch_rows: one count per (source rank, expert)");
  DispatchRows rows;
  rows.rank_tokens.assign(P, 0);
  rows.sent.assign(P, 0);
  rows.received.assign(P, 0);
  for (int e = 0; e < E; ++e) {
    const std::vector<ExpertCopy>& copies = plan.copies[e];
    int64_t n = 0;
    for (int src = 0; src < P; ++src) n += assignments[src * E + e];
    const std::vector<int64_t> split = split_assignments(copies, n);
    size_t c = 0;
    int64_t copy_left = split[0];
    for (int src = 0; src < P; ++src) {
      for (int64_t left = assignments[src * E + e]; left > 0;) {
        while (copy_left == 0) copy_left = split[++c];
        const int64_t rows_here = std::min(left, copy_left);
        const int dst = copies[c].rank;
        rows.rank_tokens[dst] += rows_here;
        if (dst != src) {
          rows.sent[src] += rows_here;
          rows.received[dst] += rows_here;
        }
        left -= rows_here;
        copy_left -= rows_here;
      }
    }
  }
  return rows;
}

}  // namespace switchyard
