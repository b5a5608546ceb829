#include "kernels/permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/runtime/rng.h"
#include "kernels/convert.h"
#include "kernels/cpu/permute.h"
#include "tests/bf16_test_util.h"
#include "tests/finite_differences.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::any_nonzero;
using testing::central_differences;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_integers;
using testing::random_vector;
using testing::values_of;

struct Plan {
  std::vector<int32_t> tokens_per_expert;
  std::vector<int32_t> dest_rows;
  int64_t permuted_rows() const {
    return std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), int64_t{0});
  }
};

Plan plan(const std::vector<int32_t>& ids, const std::vector<float>& weights, int64_t n, int k,
          int num_experts, int64_t capacity) {
  Tensor tokens_per_expert = Tensor::empty({num_experts}, DType::kI32);
  Tensor dest_rows = Tensor::empty({n, k}, DType::kI32);
  permute_plan(cpu_device(), host_tensor({n, k}, ids), host_tensor({n, k}, weights), num_experts,
               capacity, tokens_per_expert, dest_rows);
  return {values_of<int32_t>(tokens_per_expert), values_of<int32_t>(dest_rows)};
}

// k distinct experts per token, as a top-k router produces.
std::vector<int32_t> random_routing(int64_t n, int k, int num_experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  std::vector<int32_t> experts(num_experts);
  for (int64_t t = 0; t < n; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int j = 0; j < k; ++j) {
      std::swap(experts[j], experts[j + rng.below(num_experts - j)]);
      ids[t * k + j] = experts[j];
    }
  }
  return ids;
}

TEST(PermutePlanTest, DroplessLayoutByHand) {
  const std::vector<int32_t> ids = {0, 2, 1, 0, 2, 1, 0, 1};
  const std::vector<float> weights(8, 0.5f);
  const Plan p = plan(ids, weights, 4, 2, 3, -1);
  EXPECT_EQ(p.tokens_per_expert, (std::vector<int32_t>{3, 3, 2}));
  // Expert 0 holds tokens 0, 1, 3; expert 1 tokens 1, 2, 3; expert 2 tokens 0, 2.
  EXPECT_EQ(p.dest_rows, (std::vector<int32_t>{0, 6, 3, 1, 7, 4, 2, 5}));
}

TEST(PermutePlanTest, AllTokensToOneExpert) {
  const std::vector<int32_t> ids(6, 2);
  const Plan p = plan(ids, std::vector<float>(6, 1.0f), 6, 1, 4, -1);
  EXPECT_EQ(p.tokens_per_expert, (std::vector<int32_t>{0, 0, 6, 0}));
  EXPECT_EQ(p.dest_rows, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(PermutePlanTest, CapacityKeepsHighestWeights) {
  const std::vector<int32_t> ids(5, 1);
  const Plan p = plan(ids, {0.1f, 0.5f, 0.3f, 0.6f, 0.2f}, 5, 1, 3, 2);
  EXPECT_EQ(p.tokens_per_expert, (std::vector<int32_t>{0, 2, 0}));
  // Tokens 1 and 3 are kept and laid out in token order.
  EXPECT_EQ(p.dest_rows, (std::vector<int32_t>{-1, 0, -1, 1, -1}));

  // A tie at the cut: the lower token index wins.
  const Plan tie = plan(ids, {0.1f, 0.6f, 0.3f, 0.3f, 0.2f}, 5, 1, 3, 2);
  EXPECT_EQ(tie.dest_rows, (std::vector<int32_t>{-1, 0, 1, -1, -1}));

  const Plan none = plan(ids, {0.1f, 0.6f, 0.3f, 0.3f, 0.2f}, 5, 1, 3, 0);
  EXPECT_EQ(none.tokens_per_expert, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(none.dest_rows, (std::vector<int32_t>(5, -1)));
}

TEST(PermutePlanTest, UnsentAssignmentsTakeNoRow) {
  // Expert id -1 marks an assignment that is not sent (GShard's second expert); with a
  // capacity it also takes no slot from the others.
  const std::vector<int32_t> ids = {0, -1, 1, 0, 0, -1};
  const Plan p = plan(ids, {0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f}, 3, 2, 2, -1);
  EXPECT_EQ(p.tokens_per_expert, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(p.dest_rows, (std::vector<int32_t>{0, -1, 3, 1, 2, -1}));
  const Plan capped = plan(ids, {0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f}, 3, 2, 2, 2);
  EXPECT_EQ(capped.tokens_per_expert, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(capped.dest_rows, (std::vector<int32_t>{0, -1, 2, -1, 1, -1}));
}

TEST(PermutePlanTest, CapacityAboveLoadDropsNothing) {
  const int64_t n = 50;
  const int k = 2, num_experts = 4;
  const auto ids = random_routing(n, k, num_experts, 31);
  const auto weights = random_vector<float>(n * k, 32, 0.0, 1.0);
  const Plan dropless = plan(ids, weights, n, k, num_experts, -1);
  const Plan roomy = plan(ids, weights, n, k, num_experts, n);
  EXPECT_EQ(roomy.dest_rows, dropless.dest_rows);
  EXPECT_EQ(roomy.tokens_per_expert, dropless.tokens_per_expert);
  EXPECT_EQ(dropless.permuted_rows(), n * k);
}

// Received rows by source, then local expert, placed by expert, then source: 3 sources,
// 2 local experts, some blocks empty.
TEST(RegroupReceivedRowsTest, PlacesByExpertThenSource) {
  // counts[i][e]: source 0 sends 2 rows for expert 0 and 1 for expert 1; source 1 none for
  // expert 0 and 2 for expert 1; source 2 1 row for expert 0, none for expert 1.
  const Tensor counts = host_tensor<int32_t>({3, 2}, {2, 1, 0, 2, 1, 0});
  Tensor regroup = host_tensor<int32_t>({6, 1}, std::vector<int32_t>(6, -7));
  regroup_received_rows(cpu_device(), counts, regroup);
  // Expert order: s0e0 (rows 0, 1), s2e0 (row 5), s0e1 (row 2), s1e1 (rows 3, 4).
  EXPECT_EQ(values_of<int32_t>(regroup), (std::vector<int32_t>{0, 1, 3, 4, 5, 2}));
  Tensor short_regroup = Tensor::empty({5, 1}, DType::kI32);
  EXPECT_DEATH(regroup_received_rows(cpu_device(), counts, short_regroup), "do not add up");
}

TEST(PermuteTest, FullyDroppedTokenGetsZeros) {
  // Token 1 has the lowest weight at both of its experts; capacity 2 drops it twice.
  const std::vector<int32_t> ids = {0, 1, 0, 1, 1, 0};
  const std::vector<float> weights = {0.9f, 0.8f, 0.2f, 0.1f, 0.7f, 0.6f};
  const Plan p = plan(ids, weights, 3, 2, 2, 2);
  EXPECT_EQ(p.dest_rows, (std::vector<int32_t>{0, 2, -1, -1, 3, 1}));

  const int64_t hidden = 4;
  const auto yp = random_integers<float>(4 * hidden, 33, -5, 5);
  Tensor y = host_tensor({3, hidden}, std::vector<float>(3 * hidden, 7.0f));
  Tensor dest = host_tensor({3, 2}, p.dest_rows);
  unpermute_combine(cpu_device(), host_tensor({4, hidden}, yp), dest, host_tensor({3, 2}, weights),
                    y);
  const auto got = values_of<float>(y);
  for (int64_t i = 0; i < hidden; ++i) EXPECT_EQ(got[hidden + i], 0.0f);
  EXPECT_TRUE(any_nonzero(got));

  Tensor dyp = host_tensor({4, hidden}, std::vector<float>(4 * hidden, 7.0f));
  Tensor dweights = host_tensor({3, 2}, std::vector<float>(6, 7.0f));
  unpermute_combine_backward(
      cpu_device(), host_tensor({3, hidden}, random_integers<float>(3 * hidden, 34, 1, 3)),
      host_tensor({4, hidden}, yp), dest, host_tensor({3, 2}, weights), dyp, dweights);
  const auto dw = values_of<float>(dweights);
  EXPECT_EQ(dw[2], 0.0f);
  EXPECT_EQ(dw[3], 0.0f);
}

// Straightforward references, in float and the same summation order, so the ops must
// agree exactly on integer-valued inputs.
std::vector<float> reference_gather(const std::vector<float>& x, const std::vector<int32_t>& dest,
                                    int64_t n, int k, int64_t hidden, int64_t rows) {
  std::vector<float> xp(rows * hidden, 0.0f);
  for (int64_t a = 0; a < n * k; ++a) {
    if (dest[a] < 0) continue;
    for (int64_t i = 0; i < hidden; ++i) xp[dest[a] * hidden + i] = x[(a / k) * hidden + i];
  }
  return xp;
}

std::vector<float> reference_combine(const std::vector<float>& yp, const std::vector<int32_t>& dest,
                                     const std::vector<float>& weights, int64_t n, int k,
                                     int64_t hidden) {
  std::vector<float> y(n * hidden, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t row = dest[t * k + j];
      if (row < 0) continue;
      for (int64_t i = 0; i < hidden; ++i) {
        y[t * hidden + i] += weights[t * k + j] * yp[row * hidden + i];
      }
    }
  }
  return y;
}

TEST(PermuteTest, GatherAndCombineExactOnIntegers) {
  const int64_t n = 37, hidden = 16;
  const int k = 2, num_experts = 5;
  const auto ids = random_routing(n, k, num_experts, 35);
  const auto weights = random_integers<float>(n * k, 36, -3, 3);
  const auto x = random_integers<float>(n * hidden, 37, -9, 9);
  for (int64_t capacity : {int64_t{-1}, int64_t{9}}) {
    const Plan p = plan(ids, weights, n, k, num_experts, capacity);
    const int64_t rows = p.permuted_rows();
    Tensor dest = host_tensor({n, k}, p.dest_rows);
    Tensor xp = Tensor::zeros({rows, hidden});
    permute_gather(cpu_device(), host_tensor({n, hidden}, x), dest, xp);
    const auto xp_values = values_of<float>(xp);
    EXPECT_EQ(xp_values, reference_gather(x, p.dest_rows, n, k, hidden, rows));
    EXPECT_TRUE(any_nonzero(xp_values));

    const auto yp = random_integers<float>(rows * hidden, 38, -9, 9);
    Tensor y = Tensor::empty({n, hidden});
    unpermute_combine(cpu_device(), host_tensor({rows, hidden}, yp), dest,
                      host_tensor({n, k}, weights), y);
    const auto y_values = values_of<float>(y);
    EXPECT_EQ(y_values, reference_combine(yp, p.dest_rows, weights, n, k, hidden));
    EXPECT_TRUE(any_nonzero(y_values));
  }
}

TEST(PermuteTest, CombineOfGatherWithIdentityExpertsGivesInput) {
  const int64_t n = 29, hidden = 8;
  const int k = 3, num_experts = 6;
  const auto ids = random_routing(n, k, num_experts, 39);
  // Weights that sum to one per token.
  auto weights = random_vector<float>(n * k, 40, 0.1, 1.0);
  for (int64_t t = 0; t < n; ++t) {
    const float sum = weights[t * k] + weights[t * k + 1] + weights[t * k + 2];
    for (int j = 0; j < k; ++j) weights[t * k + j] /= sum;
  }
  const auto x = random_vector<float>(n * hidden, 41);
  const Plan p = plan(ids, weights, n, k, num_experts, -1);
  Tensor dest = host_tensor({n, k}, p.dest_rows);
  Tensor xp = Tensor::empty({n * k, hidden});
  permute_gather(cpu_device(), host_tensor({n, hidden}, x), dest, xp);
  Tensor y = Tensor::empty({n, hidden});
  unpermute_combine(cpu_device(), xp, dest, host_tensor({n, k}, weights), y);
  EXPECT_LT(max_relative_error(values_of<float>(y), x), 1e-6);
}

TEST(PermuteTest, GatherBackwardAccumulatesExactSums) {
  const int64_t n = 23, hidden = 12;
  const int k = 2, num_experts = 4;
  const auto ids = random_routing(n, k, num_experts, 42);
  const auto weights = random_vector<float>(n * k, 43, 0.0, 1.0);
  const Plan p = plan(ids, weights, n, k, num_experts, 8);
  const int64_t rows = p.permuted_rows();
  const auto dxp = random_integers<float>(rows * hidden, 44, -9, 9);
  const auto initial = random_integers<float>(n * hidden, 45, -9, 9);
  Tensor dx = host_tensor({n, hidden}, initial);
  permute_gather_backward(cpu_device(), host_tensor({rows, hidden}, dxp),
                          host_tensor({n, k}, p.dest_rows), dx);
  std::vector<float> expected = initial;
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t row = p.dest_rows[t * k + j];
      if (row < 0) continue;
      for (int64_t i = 0; i < hidden; ++i) expected[t * hidden + i] += dxp[row * hidden + i];
    }
  }
  EXPECT_EQ(values_of<float>(dx), expected);
}

TEST(PermuteTest, GatherBackwardMatchesFiniteDifferences) {
  const int64_t n = 6, hidden = 3;
  const int k = 2, num_experts = 3;
  const auto ids = random_routing(n, k, num_experts, 46);
  const std::vector<double> weights(n * k, 0.5);
  std::vector<int32_t> counts(num_experts), dest(n * k);
  cpu::permute_plan(ids.data(), weights.data(), n, k, num_experts, -1, counts.data(), dest.data());
  const int64_t rows = n * k;
  auto x = random_vector<double>(n * hidden, 47);
  const auto dxp = random_vector<double>(rows * hidden, 48);
  std::vector<double> dx(n * hidden, 0.0);
  cpu::permute_gather_backward(dxp.data(), dest.data(), dx.data(), n, k, hidden);
  auto loss = [&]() {
    std::vector<double> xp(rows * hidden);
    cpu::permute_gather(x.data(), dest.data(), xp.data(), n, k, hidden);
    double l = 0;
    for (size_t i = 0; i < xp.size(); ++i) l += dxp[i] * xp[i];
    return l;
  };
  EXPECT_LT(max_relative_error(dx, central_differences(x, 1e-6, loss)), 1e-8);
}

// Every element of the bf16 `actual` is the f32 `expected` rounded once.
void expect_rounded(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.numel(), expected.numel());
  for (int64_t i = 0; i < actual.numel(); ++i)
    EXPECT_EQ(actual.data<bf16>()[i].bits, to_bf16(expected.data<float>()[i]).bits) << i;
}

// bf16 rows run as the f32 ops on their exact f32 values, each stored element rounded
// once; the combine weights and their gradients stay f32 (dweights: not rounded).
TEST(PermuteTest, Bf16RowsComputeInF32) {
  const int64_t n = 41, hidden = 24;
  const int k = 3, num_experts = 5;
  const auto ids = random_routing(n, k, num_experts, 57);
  const auto router = random_vector<float>(n * k, 58, 0.0, 1.0);
  // A capacity that drops some assignments, so some tokens keep fewer than k rows.
  const Plan p = plan(ids, router, n, k, num_experts, 20);
  const int64_t rows = p.permuted_rows();
  ASSERT_LT(rows, n * k);
  const Tensor dest = host_tensor({n, k}, p.dest_rows);
  const Tensor weights = host_tensor({n, k}, random_vector<float>(n * k, 59, -1.0, 1.0));

  const Tensor x = as_bf16(host_tensor({n, hidden}, random_vector<float>(n * hidden, 60)));
  Tensor xp = Tensor::empty({rows, hidden}, DType::kBF16);
  permute_gather(cpu_device(), x, dest, xp);
  Tensor xp32 = Tensor::empty({rows, hidden});
  permute_gather(cpu_device(), widened(x), dest, xp32);
  expect_rounded(xp, xp32);

  // The accumulated dx: the bf16 start plus the rows, added in f32, rounded once.
  const Tensor dxp = as_bf16(host_tensor({rows, hidden}, random_vector<float>(rows * hidden, 61)));
  Tensor dx = as_bf16(host_tensor({n, hidden}, random_vector<float>(n * hidden, 62)));
  Tensor dx32 = widened(dx);
  permute_gather_backward(cpu_device(), dxp, dest, dx);
  permute_gather_backward(cpu_device(), widened(dxp), dest, dx32);
  expect_rounded(dx, dx32);

  const Tensor yp = as_bf16(host_tensor({rows, hidden}, random_vector<float>(rows * hidden, 63)));
  Tensor y = Tensor::empty({n, hidden}, DType::kBF16), y32 = Tensor::empty({n, hidden});
  unpermute_combine(cpu_device(), yp, dest, weights, y);
  unpermute_combine(cpu_device(), widened(yp), dest, weights, y32);
  expect_rounded(y, y32);
  EXPECT_TRUE(any_nonzero(values_of<float>(y32)));

  const Tensor dy = as_bf16(host_tensor({n, hidden}, random_vector<float>(n * hidden, 64)));
  Tensor dyp = Tensor::empty({rows, hidden}, DType::kBF16), dyp32 = Tensor::empty({rows, hidden});
  Tensor dweights = Tensor::empty({n, k}), dweights32 = Tensor::empty({n, k});
  unpermute_combine_backward(cpu_device(), dy, yp, dest, weights, dyp, dweights);
  unpermute_combine_backward(cpu_device(), widened(dy), widened(yp), dest, weights, dyp32,
                             dweights32);
  expect_rounded(dyp, dyp32);
  EXPECT_EQ(values_of<float>(dweights), values_of<float>(dweights32));
  EXPECT_TRUE(any_nonzero(values_of<float>(dweights32)));
}

TEST(PermuteDeathTest, RowsOfMixedDtypesAreRefused) {
  const int64_t n = 4, hidden = 3;
  const int k = 2;
  const Tensor dest = host_tensor({n, k}, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor weights = host_tensor({n, k}, std::vector<float>(n * k, 0.5f));
  const Tensor x16 = Tensor::zeros({n, hidden}, DType::kBF16);
  Tensor p32 = Tensor::zeros({n * k, hidden}), p16 = Tensor::zeros({n * k, hidden}, DType::kBF16);
  Tensor y16 = Tensor::zeros({n, hidden}, DType::kBF16);
  EXPECT_DEATH(permute_gather(cpu_device(), x16, dest, p32),
               "x and xp must be both f32 or both bf16");
  EXPECT_DEATH(permute_gather_backward(cpu_device(), p32, dest, y16),
               "dxp and dx must be both f32 or both bf16");
  EXPECT_DEATH(unpermute_combine(cpu_device(), p16, dest, as_bf16(weights), y16),
               "weights must be f32");
  Tensor dweights = Tensor::zeros({n, k}), dweights16 = Tensor::zeros({n, k}, DType::kBF16);
  EXPECT_DEATH(unpermute_combine_backward(cpu_device(), x16, p32, dest, weights, p16, dweights),
               "dy, yp and dyp must be all f32 or all bf16");
  EXPECT_DEATH(unpermute_combine_backward(cpu_device(), x16, p16, dest, weights, p16, dweights16),
               "dweights must be f32");
  // Integer rows are not float rows at all.
  Tensor xi = Tensor::zeros({n, hidden}, DType::kI32),
         pi = Tensor::zeros({n * k, hidden}, DType::kI32);
  EXPECT_DEATH(permute_gather(cpu_device(), xi, dest, pi),
               "x and xp must be both f32 or both bf16");
}

}  // namespace
}  // namespace switchyard
