#include "kernels/gating.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/runtime/rng.h"
#include "kernels/cpu/gating.h"
#include "kernels/router_aux.h"
#include "tests/finite_differences.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_vector;
using testing::values_of;

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

struct Gated {
  std::vector<double> probs;
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

// Naive reference: double softmax, a full stable sort by descending probability (so
// ties keep the lower id first), the first k, optionally divided by their sum.
Gated reference_gating(const std::vector<double>& logits, int64_t n, int64_t num_experts, int k,
                       bool renormalize) {
  Gated out{std::vector<double>(n * num_experts), std::vector<int32_t>(n * k),
            std::vector<double>(n * k)};
  for (int64_t r = 0; r < n; ++r) {
    const double* l = &logits[r * num_experts];
    double* p = &out.probs[r * num_experts];
    const double max = *std::max_element(l, l + num_experts);
    double sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(l[e] - max);
    for (int64_t e = 0; e < num_experts; ++e) p[e] = std::exp(l[e] - max) / sum;
    std::vector<int32_t> order(num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [p](int32_t a, int32_t b) { return p[a] > p[b]; });
    double selected = 0;
    for (int j = 0; j < k; ++j) selected += p[order[j]];
    for (int j = 0; j < k; ++j) {
      out.ids[r * k + j] = order[j];
      out.weights[r * k + j] = renormalize ? p[order[j]] / selected : p[order[j]];
    }
  }
  return out;
}

std::vector<double> numeric_gradient(std::vector<double> x,
                                     const std::function<double(const std::vector<double>&)>& f) {
  return testing::central_differences(x, 1e-6, [&] { return f(x); });
}

Gated gate_double(const std::vector<double>& logits, int64_t n, int64_t num_experts, int k,
                  bool renormalize) {
  Gated g{std::vector<double>(n * num_experts), std::vector<int32_t>(n * k),
          std::vector<double>(n * k)};
  cpu::gating_forward(logits.data(), g.probs.data(), g.ids.data(), g.weights.data(), n, num_experts,
                      k, renormalize);
  return g;
}

// Expert ids of -1 (no expert: a dropped or unsent slot) among rows that keep theirs:
// row 1's last slot, every slot of row 2, row 3's first and the last row's first.
void punch_no_expert_slots(std::vector<int32_t>& ids, int64_t n, int k) {
  ids[k + k - 1] = -1;
  std::fill_n(ids.begin() + 2 * k, k, -1);
  ids[3 * k] = -1;
  ids[(n - 1) * k] = -1;
}

// One row's backward on `kept` slots: (probs, ids, dweights, dlogits) of that row.
using RowBackward =
    std::function<void(const double*, const int32_t*, const double*, double*, int kept)>;

// The reference for rows with -1 slots: each row's backward on its other slots alone
// (zeros for a row with none), one row at a time, so no row can reach another.
std::vector<double> backward_of_kept_slots(const std::vector<double>& probs,
                                           const std::vector<int32_t>& ids,
                                           const std::vector<double>& dweights, int64_t n,
                                           int64_t num_experts, int k,
                                           const RowBackward& backward) {
  std::vector<double> dlogits(n * num_experts, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int32_t> kept_ids;
    std::vector<double> kept_dweights;
    for (int j = 0; j < k; ++j) {
      if (ids[r * k + j] < 0) continue;
      kept_ids.push_back(ids[r * k + j]);
      kept_dweights.push_back(dweights[r * k + j]);
    }
    if (kept_ids.empty()) continue;
    backward(&probs[r * num_experts], kept_ids.data(), kept_dweights.data(),
             &dlogits[r * num_experts], static_cast<int>(kept_ids.size()));
  }
  return dlogits;
}

// Row by row, so a failure names the row a -1 slot reached.
void expect_rows_match(const std::vector<float>& got, const std::vector<double>& expected,
                       int64_t n, int64_t num_experts) {
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> row(got.begin() + r * num_experts, got.begin() + (r + 1) * num_experts);
    const std::vector<double> want(expected.begin() + r * num_experts,
                                   expected.begin() + (r + 1) * num_experts);
    EXPECT_LT(max_relative_error(row, want), 1e-6) << "row " << r;
  }
  EXPECT_TRUE(any_nonzero(got));
}

TEST(GatingTest, ForwardMatchesDoubleReference) {
  const int64_t n = 33, num_experts = 8;
  const int k = 2;
  const auto logits = random_vector<float>(n * num_experts, 11, -3.0, 3.0);
  for (bool renormalize : {false, true}) {
    Tensor probs = Tensor::empty({n, num_experts});
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    Tensor weights = Tensor::empty({n, k});
    gating_forward(cpu_device(), host_tensor({n, num_experts}, logits), k, renormalize, probs, ids,
                   weights);
    const Gated ref = reference_gating(to_double(logits), n, num_experts, k, renormalize);
    EXPECT_LT(max_relative_error(values_of<float>(probs), ref.probs), 1e-6);
    EXPECT_EQ(values_of<int32_t>(ids), ref.ids);
    EXPECT_LT(max_relative_error(values_of<float>(weights), ref.weights), 1e-6);
    EXPECT_TRUE(any_nonzero(values_of<float>(weights)));
  }
}

TEST(GatingTest, TiesGoToLowerExpertId) {
  // Row 0: all equal. Row 1: experts 1 and 2 tie for first, 0 and 3 tie below them.
  const std::vector<double> logits = {0.5, 0.5, 0.5, 0.5, -1.0, 2.0, 2.0, -1.0};
  const Gated plain = gate_double(logits, 2, 4, 3, false);
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1, 2, 1, 2, 0}));
  for (int j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(plain.weights[j], 0.25);
  const Gated renorm = gate_double(logits, 2, 4, 3, true);
  EXPECT_EQ(renorm.ids, plain.ids);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(renorm.weights[j], 1.0 / 3.0, 1e-15);
  EXPECT_DOUBLE_EQ(renorm.weights[3], renorm.weights[4]);
}

TEST(GatingTest, KEqualsNumExperts) {
  const std::vector<double> logits = {0.1, 2.0, -1.0, 0.7};
  const Gated plain = gate_double(logits, 1, 4, 4, false);
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{1, 3, 0, 2}));
  for (int j = 0; j < 4; ++j) EXPECT_DOUBLE_EQ(plain.weights[j], plain.probs[plain.ids[j]]);
  // The probabilities already sum to one, so renormalising changes neither the
  // weights nor their gradient.
  const Gated renorm = gate_double(logits, 1, 4, 4, true);
  EXPECT_LT(max_relative_error(renorm.weights, plain.weights), 1e-15);
  const std::vector<double> dweights = {0.3, -1.2, 0.8, 0.4};
  std::vector<double> dlogits_plain(4), dlogits_renorm(4);
  cpu::gating_backward(plain.probs.data(), plain.ids.data(), dweights.data(), dlogits_plain.data(),
                       1, 4, 4, false);
  cpu::gating_backward(renorm.probs.data(), renorm.ids.data(), dweights.data(),
                       dlogits_renorm.data(), 1, 4, 4, true);
  EXPECT_TRUE(any_nonzero(dlogits_plain));
  EXPECT_LT(max_relative_error(dlogits_renorm, dlogits_plain), 1e-15);
}

TEST(GatingTest, KEqualsOne) {
  const std::vector<double> logits = {0.2, -0.4, 1.5};
  const Gated plain = gate_double(logits, 1, 3, 1, false);
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{2}));
  EXPECT_DOUBLE_EQ(plain.weights[0], plain.probs[2]);
  const Gated renorm = gate_double(logits, 1, 3, 1, true);
  EXPECT_DOUBLE_EQ(renorm.weights[0], 1.0);

  // Without renormalisation dlogit_e = dw * p_i * (delta_ie - p_e).
  const double dw = 0.9;
  std::vector<double> dlogits(3);
  cpu::gating_backward(plain.probs.data(), plain.ids.data(), &dw, dlogits.data(), 1, 3, 1, false);
  const auto& p = plain.probs;
  for (int e = 0; e < 3; ++e) {
    EXPECT_NEAR(dlogits[e], dw * p[2] * ((e == 2 ? 1.0 : 0.0) - p[e]), 1e-15);
  }
  cpu::gating_backward(renorm.probs.data(), renorm.ids.data(), &dw, dlogits.data(), 1, 3, 1, true);
  for (double d : dlogits) EXPECT_NEAR(d, 0.0, 1e-15);
}

// A slot with expert id -1 selects nothing: its row's gradient is that of its other slots
// alone, and the rows beside it keep theirs (read as a column, -1 is the row before's
// last expert).
TEST(GatingTest, BackwardSkipsNoExpertSlots) {
  const int64_t n = 6, num_experts = 5;
  const int k = 3;
  const auto logits = random_vector<float>(n * num_experts, 16, -3.0, 3.0);
  const auto dweights = random_vector<float>(n * k, 17);
  for (bool renormalize : {false, true}) {
    SCOPED_TRACE(renormalize ? "renormalized" : "plain");
    Tensor probs = Tensor::empty({n, num_experts});
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    Tensor weights = Tensor::empty({n, k});
    gating_forward(cpu_device(), host_tensor({n, num_experts}, logits), k, renormalize, probs, ids,
                   weights);
    std::vector<int32_t> holed = values_of<int32_t>(ids);
    punch_no_expert_slots(holed, n, k);
    Tensor dlogits =
        host_tensor({n, num_experts}, std::vector<float>(n * num_experts, std::nanf("")));
    gating_backward(cpu_device(), probs, host_tensor({n, k}, holed), host_tensor({n, k}, dweights),
                    renormalize, dlogits);
    const auto expected = backward_of_kept_slots(
        to_double(values_of<float>(probs)), holed, to_double(dweights), n, num_experts, k,
        [&](const double* p, const int32_t* kept_ids, const double* dw, double* dl, int kept) {
          cpu::gating_backward(p, kept_ids, dw, dl, 1, num_experts, kept, renormalize);
        });
    expect_rows_match(values_of<float>(dlogits), expected, n, num_experts);
  }
}

// The sigmoid router as transformers' DeepSeek-V3 router computes it, written out
// naively in double: scores = sigmoid(logits); choice = scores + bias; each group ranks by
// the sum of its two best choices; outside the best top_groups groups the choice is out;
// the k best choices (full stable sorts, ties to the lower index); weights = the chosen
// scores, over their sum + 1e-20 when renormalised, times the scaling.
Gated reference_sigmoid_gating(const std::vector<double>& logits, const std::vector<float>& bias,
                               int64_t n, int64_t num_experts, const SigmoidGating& g) {
  Gated out{std::vector<double>(n * num_experts), std::vector<int32_t>(n * g.k),
            std::vector<double>(n * g.k)};
  const int64_t size = num_experts / g.num_groups;
  auto descending = [](const std::vector<double>& v) {
    std::vector<int32_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&v](int32_t a, int32_t b) { return v[a] > v[b]; });
    return order;
  };
  for (int64_t r = 0; r < n; ++r) {
    double* s = &out.probs[r * num_experts];
    std::vector<double> choice(num_experts);
    for (int64_t e = 0; e < num_experts; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[r * num_experts + e]));
      choice[e] = s[e] + bias[e];
    }
    std::vector<double> group_scores(g.num_groups);
    for (int grp = 0; grp < g.num_groups; ++grp) {
      std::vector<double> members(choice.begin() + grp * size, choice.begin() + (grp + 1) * size);
      std::sort(members.rbegin(), members.rend());
      group_scores[grp] = members[0] + (size > 1 ? members[1] : 0.0);
    }
    const std::vector<int32_t> groups = descending(group_scores);
    std::vector<bool> allowed(g.num_groups, false);
    for (int j = 0; j < g.top_groups; ++j) allowed[groups[j]] = true;
    for (int64_t e = 0; e < num_experts; ++e)
      if (!allowed[e / size]) choice[e] = -std::numeric_limits<double>::infinity();
    const std::vector<int32_t> order = descending(choice);
    double total = 0;
    for (int j = 0; j < g.k; ++j) total += s[order[j]];
    for (int j = 0; j < g.k; ++j) {
      out.ids[r * g.k + j] = order[j];
      out.weights[r * g.k + j] =
          (g.renormalize ? s[order[j]] / (total + 1e-20) : s[order[j]]) * g.scaling;
    }
  }
  return out;
}

Gated sigmoid_gate_double(const std::vector<double>& logits, const std::vector<float>& bias,
                          int64_t n, int64_t num_experts, const SigmoidGating& g) {
  Gated out{std::vector<double>(n * num_experts), std::vector<int32_t>(n * g.k),
            std::vector<double>(n * g.k)};
  cpu::sigmoid_gating_forward(logits.data(), bias.data(), out.probs.data(), out.ids.data(),
                              out.weights.data(), n, num_experts, g);
  return out;
}

std::vector<SigmoidGating> sigmoid_cases() {
  return {{.k = 4, .renormalize = true, .scaling = 2.5f, .num_groups = 4, .top_groups = 2},
          {.k = 2, .renormalize = false, .scaling = 1.0f, .num_groups = 1, .top_groups = 1},
          {.k = 3, .renormalize = true, .scaling = 1.0f, .num_groups = 8, .top_groups = 3},
          {.k = 6, .renormalize = false, .scaling = 0.5f, .num_groups = 2, .top_groups = 1}};
}

TEST(SigmoidGatingTest, ForwardMatchesDoubleReference) {
  const int64_t n = 41, num_experts = 16;
  const auto logits = random_vector<float>(n * num_experts, 31, -3.0, 3.0);
  const auto bias = random_vector<float>(num_experts, 32, -0.3, 0.3);
  for (const SigmoidGating& g : sigmoid_cases()) {
    SCOPED_TRACE(::testing::Message() << "k " << g.k << ", groups " << g.top_groups << " of "
                                      << g.num_groups);
    Tensor scores = Tensor::empty({n, num_experts});
    Tensor ids = Tensor::empty({n, g.k}, DType::kI32);
    Tensor weights = Tensor::empty({n, g.k});
    sigmoid_gating_forward(cpu_device(), host_tensor({n, num_experts}, logits),
                           host_tensor({num_experts}, bias), g, scores, ids, weights);
    const Gated ref = reference_sigmoid_gating(to_double(logits), bias, n, num_experts, g);
    EXPECT_LT(max_relative_error(values_of<float>(scores), ref.probs), 1e-6);
    EXPECT_EQ(values_of<int32_t>(ids), ref.ids);
    EXPECT_LT(max_relative_error(values_of<float>(weights), ref.weights), 1e-6);
    EXPECT_TRUE(any_nonzero(values_of<float>(weights)));
  }
}

// The bias decides the choice and nothing else: a large bias on one expert puts it in
// every token's top k with the weight of its own score.
TEST(SigmoidGatingTest, BiasSelectsButDoesNotWeigh) {
  const int64_t n = 7, num_experts = 8;
  const SigmoidGating g{.k = 2, .renormalize = false, .scaling = 1.0f, .num_groups = 1,
                        .top_groups = 1};
  const auto logits = to_double(random_vector<float>(n * num_experts, 33, -2.0, 2.0));
  std::vector<float> bias(num_experts, 0.0f);
  bias[5] = 10.0f;
  const Gated out = sigmoid_gate_double(logits, bias, n, num_experts, g);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(out.ids[r * 2], 5);
    EXPECT_DOUBLE_EQ(out.weights[r * 2], out.probs[r * num_experts + 5]);
    EXPECT_DOUBLE_EQ(out.weights[r * 2 + 1], out.probs[r * num_experts + out.ids[r * 2 + 1]]);
  }
}

// Group-limited routing keeps every choice inside the best groups, even where a better
// score lies outside them: group 0 has one excellent expert, group 1 two good ones.
TEST(SigmoidGatingTest, GroupsRankByTheirTwoBestExperts) {
  const std::vector<double> logits = {6.0, -6.0, -6.0, -6.0, 2.0, 2.5, -6.0, -6.0};
  const std::vector<float> bias(8, 0.0f);
  const SigmoidGating limited{.k = 2, .renormalize = true, .scaling = 1.0f, .num_groups = 2,
                              .top_groups = 1};
  const Gated in_group = sigmoid_gate_double(logits, bias, 1, 8, limited);
  EXPECT_EQ(in_group.ids, (std::vector<int32_t>{5, 4}));
  EXPECT_NEAR(in_group.weights[0] + in_group.weights[1], 1.0, 1e-15);
  SigmoidGating open = limited;
  open.num_groups = open.top_groups = 1;
  EXPECT_EQ(sigmoid_gate_double(logits, bias, 1, 8, open).ids, (std::vector<int32_t>{0, 5}));
}

// As GatingTest.BackwardSkipsNoExpertSlots, for the sigmoid router.
TEST(SigmoidGatingTest, BackwardSkipsNoExpertSlots) {
  const int64_t n = 7, num_experts = 16;
  const auto logits = random_vector<float>(n * num_experts, 41, -3.0, 3.0);
  const auto bias = random_vector<float>(num_experts, 42, -0.2, 0.2);
  for (const SigmoidGating& g : sigmoid_cases()) {
    SCOPED_TRACE(::testing::Message() << "k " << g.k << ", groups " << g.top_groups << " of "
                                      << g.num_groups);
    const auto dweights = random_vector<float>(n * g.k, 43);
    Tensor scores = Tensor::empty({n, num_experts});
    Tensor ids = Tensor::empty({n, g.k}, DType::kI32);
    Tensor weights = Tensor::empty({n, g.k});
    sigmoid_gating_forward(cpu_device(), host_tensor({n, num_experts}, logits),
                           host_tensor({num_experts}, bias), g, scores, ids, weights);
    std::vector<int32_t> holed = values_of<int32_t>(ids);
    punch_no_expert_slots(holed, n, g.k);
    Tensor dlogits =
        host_tensor({n, num_experts}, std::vector<float>(n * num_experts, std::nanf("")));
    sigmoid_gating_backward(cpu_device(), scores, host_tensor({n, g.k}, holed),
                            host_tensor({n, g.k}, dweights), g, dlogits);
    const auto expected = backward_of_kept_slots(
        to_double(values_of<float>(scores)), holed, to_double(dweights), n, num_experts, g.k,
        [&](const double* s, const int32_t* kept_ids, const double* dw, double* dl, int kept) {
          SigmoidGating fewer = g;
          fewer.k = kept;
          cpu::sigmoid_gating_backward(s, kept_ids, dw, dl, 1, num_experts, fewer);
        });
    expect_rows_match(values_of<float>(dlogits), expected, n, num_experts);
  }
}

TEST(SigmoidGatingTest, RouterSumsAreTheRoutingCountsAndZLossSum) {
  const int64_t n = 200, num_experts = 8;
  const SigmoidGating g{.k = 2, .renormalize = true, .scaling = 1.0f, .num_groups = 4,
                        .top_groups = 2};
  const Tensor logits =
      host_tensor({n, num_experts}, random_vector<float>(n * num_experts, 39, -3.0, 3.0));
  const Tensor bias = host_tensor({num_experts}, random_vector<float>(num_experts, 40, -0.1, 0.1));
  Tensor scores = Tensor::empty({n, num_experts}), ids = Tensor::empty({n, g.k}, DType::kI32);
  Tensor weights = Tensor::empty({n, g.k});
  Tensor sums =
      host_tensor({2 * num_experts + 1}, std::vector<float>(2 * num_experts + 1, std::nanf("")));
  sigmoid_router_forward(cpu_device(), logits, bias, g, scores, ids, weights, sums);
  Tensor selections = Tensor::empty({num_experts}), score_sums = Tensor::empty({num_experts});
  routing_counts(cpu_device(), scores, ids, selections, score_sums);
  Tensor z_sum = Tensor::empty({1});
  router_z_loss_sum(cpu_device(), logits, z_sum);
  std::vector<float> want = values_of<float>(selections);
  for (float p : values_of<float>(score_sums)) want.push_back(p);
  want.push_back(*z_sum.data<float>());
  EXPECT_EQ(values_of<float>(sums), want);
  EXPECT_FLOAT_EQ(std::accumulate(want.begin(), want.begin() + num_experts, 0.0f), n * g.k);
}

TEST(SigmoidGatingTest, RefusesGroupsThatCannotHoldTopK) {
  const Tensor logits = host_tensor({2, 8}, std::vector<float>(16, 0.0f));
  const Tensor bias = host_tensor({8}, std::vector<float>(8, 0.0f));
  Tensor scores = Tensor::empty({2, 8}), ids = Tensor::empty({2, 3}, DType::kI32);
  Tensor weights = Tensor::empty({2, 3});
  const SigmoidGating too_few{.k = 3, .num_groups = 4, .top_groups = 1};
  EXPECT_DEATH(sigmoid_gating_forward(cpu_device(), logits, bias, too_few, scores, ids, weights),
               "k must be in");
  const SigmoidGating uneven{.k = 3, .num_groups = 3, .top_groups = 3};
  EXPECT_DEATH(sigmoid_gating_forward(cpu_device(), logits, bias, uneven, scores, ids, weights),
               "num_groups must divide E");
}

// moe.router_force_balance: k consecutive experts per token, round the experts, so n k
// assignments load each expert n k / E times when E divides them.
TEST(RoundRobinRoutingTest, LoadsEveryExpertEqually) {
  const int64_t n = 12, num_experts = 6;
  const int k = 2;
  Tensor ids = host_tensor({n, k}, std::vector<int32_t>(n * k, -7));
  Tensor weights = Tensor::empty({n, k});
  round_robin_routing(cpu_device(), /*first_token=*/9, num_experts, ids, weights);
  std::vector<int> load(num_experts, 0);
  const std::vector<int32_t> got = values_of<int32_t>(ids);
  for (int64_t a = 0; a < n * k; ++a) {
    ASSERT_EQ(got[a], (9 * k + a) % num_experts);
    ++load[got[a]];
  }
  for (int l : load) EXPECT_EQ(l, n * k / num_experts);
  for (float w : values_of<float>(weights)) EXPECT_EQ(w, 0.5f);
}

// Expert choice written out naively: per expert, a stable sort of the tokens by
// descending probability, the first `capacity` taken.
Gated reference_expert_choice(const std::vector<double>& probs, int64_t n, int64_t num_experts,
                              int64_t capacity) {
  Gated out{probs, std::vector<int32_t>(n * num_experts, -1),
            std::vector<double>(n * num_experts, 0.0)};
  for (int64_t e = 0; e < num_experts; ++e) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return probs[a * num_experts + e] > probs[b * num_experts + e];
    });
    for (int64_t j = 0; j < std::min(capacity, n); ++j) {
      out.ids[order[j] * num_experts + e] = static_cast<int32_t>(e);
      out.weights[order[j] * num_experts + e] = probs[order[j] * num_experts + e];
    }
  }
  return out;
}

Gated expert_choice_double(const std::vector<double>& logits, int64_t n, int64_t num_experts,
                           int64_t capacity) {
  Gated softmax = gate_double(logits, n, num_experts, 1, false);
  Gated out{softmax.probs, std::vector<int32_t>(n * num_experts),
            std::vector<double>(n * num_experts)};
  cpu::expert_choice_forward(out.probs.data(), out.ids.data(), out.weights.data(), n, num_experts,
                             capacity);
  return out;
}

TEST(ExpertChoiceTest, ForwardMatchesNaiveReference) {
  const int64_t n = 37, num_experts = 6;
  for (const int64_t capacity : {int64_t{1}, int64_t{13}, int64_t{37}, int64_t{50}}) {
    const auto logits = random_vector<float>(n * num_experts, 41, -3.0, 3.0);
    Tensor probs = Tensor::empty({n, num_experts}), ids = Tensor::empty({n, num_experts}, DType::kI32);
    Tensor weights = Tensor::empty({n, num_experts});
    Tensor sums = Tensor::empty({2 * num_experts + 1});
    expert_choice_router_forward(cpu_device(), host_tensor({n, num_experts}, logits), capacity,
                                 probs, ids, weights, sums);
    const Gated ref =
        reference_expert_choice(to_double(values_of<float>(probs)), n, num_experts, capacity);
    EXPECT_EQ(values_of<int32_t>(ids), ref.ids) << capacity;
    EXPECT_EQ(max_relative_error(values_of<float>(weights), ref.weights), 0.0);
    // Each expert took min(capacity, n) tokens.
    for (int64_t e = 0; e < num_experts; ++e)
      EXPECT_EQ(sums.data<float>()[e], static_cast<float>(std::min(capacity, n)));
  }
}

TEST(ExpertChoiceTest, TiesGoToTheEarlierToken) {
  // Four tokens of equal probabilities: each expert takes the first two.
  const Gated out = expert_choice_double(std::vector<double>(8, 0.3), 4, 2, 2);
  EXPECT_EQ(out.ids, (std::vector<int32_t>{0, 1, 0, 1, -1, -1, -1, -1}));
}

TEST(ExpertChoiceTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 6, num_experts = 4, capacity = 3;
  std::vector<double> logits = random_vector<double>(n * num_experts, 42, -0.05, 0.05);
  // Far-apart probabilities for each expert, so no step reorders its tokens.
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < num_experts; ++e)
      logits[t * num_experts + e] += 0.5 * static_cast<double>((t * 5 + e * 3) % (n + 1));
  const auto dweights = random_vector<double>(n * num_experts, 43);
  const Gated g = expert_choice_double(logits, n, num_experts, capacity);
  std::vector<double> dlogits(n * num_experts, 9.0);
  cpu::expert_choice_backward(g.probs.data(), g.ids.data(), dweights.data(), dlogits.data(), n,
                              num_experts);
  const auto numeric = numeric_gradient(logits, [&](const std::vector<double>& x) {
    const Gated gx = expert_choice_double(x, n, num_experts, capacity);
    EXPECT_EQ(gx.ids, g.ids);
    double l = 0;
    for (int64_t a = 0; a < n * num_experts; ++a) l += dweights[a] * gx.weights[a];
    return l;
  });
  EXPECT_TRUE(any_nonzero(dlogits));
  EXPECT_LT(max_relative_error(dlogits, numeric), 1e-8);
}

TEST(RouterZLossTest, ForwardMatchesDoubleReference) {
  const int64_t n = 2000, num_experts = 16;
  const auto logits = random_vector<float>(n * num_experts, 21, -5.0, 5.0);
  double expected = 0;
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(double(logits[r * num_experts + e]));
    expected += std::log(sum) * std::log(sum);
  }
  Tensor z_sum = Tensor::empty({1});
  router_z_loss_sum(cpu_device(), host_tensor({n, num_experts}, logits), z_sum);
  EXPECT_NEAR(*z_sum.data<float>(), expected, 1e-6 * expected);
  expected /= n;
  const double got = cpu::router_z_loss_forward(logits.data(), n, num_experts);
  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_GT(got, 0.0);
}

// The router's one op: the gating outputs of gating_forward, then the selections,
// probability sums and z-loss sum in one (2E + 1) buffer.
TEST(RouterForwardTest, SumsAreTheRoutingCountsAndZLossSum) {
  const int64_t n = 300, num_experts = 6;
  const int k = 2;
  const Tensor logits =
      host_tensor({n, num_experts}, random_vector<float>(n * num_experts, 24, -3.0, 3.0));
  Tensor probs = Tensor::empty({n, num_experts}), ids = Tensor::empty({n, k}, DType::kI32);
  Tensor weights = Tensor::empty({n, k});
  Tensor sums =
      host_tensor({2 * num_experts + 1}, std::vector<float>(2 * num_experts + 1, std::nanf("")));
  router_forward(cpu_device(), logits, k, /*renormalize=*/true, probs, ids, weights, sums);

  Tensor want_probs = Tensor::empty({n, num_experts}),
         want_ids = Tensor::empty({n, k}, DType::kI32);
  Tensor want_weights = Tensor::empty({n, k});
  gating_forward(cpu_device(), logits, k, true, want_probs, want_ids, want_weights);
  EXPECT_EQ(values_of<float>(probs), values_of<float>(want_probs));
  EXPECT_EQ(values_of<int32_t>(ids), values_of<int32_t>(want_ids));
  EXPECT_EQ(values_of<float>(weights), values_of<float>(want_weights));
  Tensor selections = Tensor::empty({num_experts}), prob_sums = Tensor::empty({num_experts});
  routing_counts(cpu_device(), want_probs, want_ids, selections, prob_sums);
  Tensor z_sum = Tensor::empty({1});
  router_z_loss_sum(cpu_device(), logits, z_sum);
  std::vector<float> want = values_of<float>(selections);
  for (float p : values_of<float>(prob_sums)) want.push_back(p);
  want.push_back(*z_sum.data<float>());
  EXPECT_EQ(values_of<float>(sums), want);
  Tensor short_sums = Tensor::empty({2 * num_experts});
  EXPECT_DEATH(router_forward(cpu_device(), logits, k, true, probs, ids, weights, short_sums),
               "sums must be");
}

// GShard's second expert goes with probability min(1, 2 w): token t's draw is the t-th
// number of the Rng stream whose next draw is `first_draw`; the first expert always goes.
TEST(GshardDispatchTest, SendsTheSecondExpertWithProbabilityTwiceItsWeight) {
  const int64_t n = 20000;
  std::vector<int32_t> ids(2 * n);
  std::vector<float> weights(2 * n);
  for (int64_t t = 0; t < n; ++t) {
    ids[2 * t] = static_cast<int32_t>(t % 5);
    ids[2 * t + 1] = static_cast<int32_t>(5 + t % 3);
    weights[2 * t] = 0.6f;
    weights[2 * t + 1] = t % 4 == 0 ? 0.5f : (t % 4 == 1 ? 0.0f : 0.2f);
  }
  const uint64_t seed = 99, first_draw = 1234;
  Tensor out = host_tensor({n, 2}, std::vector<int32_t>(2 * n, 77));
  gshard_dispatch_ids(cpu_device(), host_tensor({n, 2}, ids), host_tensor({n, 2}, weights), seed,
                      first_draw, out);
  const std::vector<int32_t> got = values_of<int32_t>(out);
  Rng stream(seed, first_draw - 1);
  int64_t light = 0, light_sent = 0;
  for (int64_t t = 0; t < n; ++t) {
    ASSERT_EQ(got[2 * t], ids[2 * t]);
    const bool sent = stream.uniform() < 2.0 * weights[2 * t + 1];
    ASSERT_EQ(got[2 * t + 1], sent ? ids[2 * t + 1] : -1) << t;
    if (t % 4 <= 1) {
      ASSERT_EQ(sent, t % 4 == 0);  // weight 1/2: always; weight 0: never
    }
    if (t % 4 >= 2) {
      ++light;
      light_sent += sent;
    }
  }
  // Weight 0.2: sent 40% of the time (10000 tokens; 4 sigma is 0.02).
  EXPECT_NEAR(static_cast<double>(light_sent) / static_cast<double>(light), 0.4, 0.02);
  Tensor three = Tensor::empty({n, 3}, DType::kI32);
  EXPECT_DEATH(gshard_dispatch_ids(cpu_device(), three, three, seed, first_draw, three),
               "expert_ids must be i32 \\(n, 2\\)");
}

// Large logits: the max shift keeps exp finite in the loss and its gradient.
TEST(RouterZLossTest, LargeLogitsStayFinite) {
  const std::vector<double> big = {1000.0, 999.0};
  std::vector<double> dbig(2, 0.0);
  cpu::router_z_loss_backward(big.data(), 1.0, dbig.data(), 1, 2);
  EXPECT_TRUE(std::isfinite(dbig[0]) && std::isfinite(dbig[1]));
  EXPECT_TRUE(std::isfinite(cpu::router_z_loss_forward(big.data(), 1, 2)));
}

}  // namespace
}  // namespace switchyard
