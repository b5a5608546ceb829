// CUDA dispatch plan, gather and combine against their CPU twins, bit for bit: the plan is
// integer bookkeeping, and integer-valued rows with power-of-two weights make every sum
// exact. bf16 rows too: integers of that size are exact in bf16, as are the sums.
#include "kernels/permute.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "engine/runtime/rng.h"
#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_close;
using testing::all_equal;
using testing::any_nonzero;
using testing::host_tensor;
using testing::integer_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;
using testing::values_of;

constexpr int kExperts = 9;

// Top-k style routing: k distinct experts per token, never experts 3 and 8 (so some
// groups are empty), and every 5th token's last assignment not sent (-1).
Tensor routing(int64_t n, int k, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> experts = {0, 1, 2, 4, 5, 6, 7};
    for (int j = 0; j < k; ++j) {
      std::swap(experts[j], experts[j + rng.below(experts.size() - j)]);
      ids[t * k + j] = experts[j];
    }
    if (t % 5 == 0) ids[t * k + k - 1] = -1;
  }
  return host_tensor({n, k}, ids);
}

// Router weights from a few values, so capacity decisions meet many ties, plus the
// special values the ranking must order like the CPU: NaN, -inf, +0 and -0.
Tensor router_weights(int64_t n, int k, uint64_t seed) {
  const float choices[] = {0.125f, 0.25f, 0.5f, 0.75f};
  Rng rng(seed);
  std::vector<float> w(n * k);
  for (float& x : w) x = choices[rng.below(4)];
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (size_t i = 0; i < w.size(); i += 11) w[i] = special[(i / 11) % 4];
  return host_tensor({n, k}, w);
}

// Combine weights: exact binary fractions, so weighted sums of integers are exact.
Tensor combine_weights(int64_t n, int k, uint64_t seed) {
  const float choices[] = {0.25f, 0.5f, -0.75f, 1.0f};
  Rng rng(seed);
  std::vector<float> w(n * k);
  for (float& x : w) x = choices[rng.below(4)];
  return host_tensor({n, k}, w);
}

struct Case {
  int64_t n;
  int k;
  int64_t capacity;  // < 0: dropless
};

class PermuteGpu : public ::testing::TestWithParam<Case> {};

TEST_P(PermuteGpu, PlanGatherAndCombineMatchCpuExactly) {
  const Case c = GetParam();
  CudaDevice gpu(0);
  const int64_t hidden = 129;
  const Tensor ids = routing(c.n, c.k, 1);
  const Tensor weights = router_weights(c.n, c.k, 2);
  const Tensor gids = to_device(gpu, ids), gweights = to_device(gpu, weights);

  Tensor tokens_per_expert = Tensor::empty({kExperts}, DType::kI32);
  Tensor dest_rows = Tensor::empty({c.n, c.k}, DType::kI32);
  permute_plan(cpu_device(), ids, weights, kExperts, c.capacity, tokens_per_expert, dest_rows);

  // Counts on the device, then on the host (the form the grouped GEMMs take).
  Tensor gcounts = poisoned(gpu, {kExperts}, DType::kI32);
  Tensor gdest = poisoned(gpu, {c.n, c.k}, DType::kI32);
  permute_plan(gpu, gids, gweights, kExperts, c.capacity, gcounts, gdest);
  EXPECT_TRUE(all_equal(gcounts, tokens_per_expert));
  EXPECT_TRUE(all_equal(gdest, dest_rows));
  Tensor host_counts = host_tensor({kExperts}, std::vector<int32_t>(kExperts, 0x7F7F7F7F));
  Tensor gdest2 = poisoned(gpu, {c.n, c.k}, DType::kI32);
  permute_plan(gpu, gids, gweights, kExperts, c.capacity, host_counts, gdest2);
  EXPECT_TRUE(all_equal(host_counts, tokens_per_expert));
  EXPECT_TRUE(all_equal(gdest2, dest_rows));

  const std::vector<int32_t> counts = values_of<int32_t>(tokens_per_expert);
  const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(counts[8], 0);

  // Gather: every row of xp is some token's row.
  const Tensor x = integer_tensor({c.n, hidden}, 3, -8, 8);
  Tensor xp = Tensor::empty({rows, hidden});
  permute_gather(cpu_device(), x, dest_rows, xp);
  Tensor gxp = poisoned(gpu, {rows, hidden});
  permute_gather(gpu, to_device(gpu, x), gdest, gxp);
  EXPECT_TRUE(all_equal(gxp, xp));

  Tensor dx = integer_tensor({c.n, hidden}, 4, -8, 8);  // accumulated into
  Tensor gdx = to_device(gpu, dx);
  permute_gather_backward(gpu, to_device(gpu, xp), gdest, gdx);
  permute_gather_backward(cpu_device(), xp, dest_rows, dx);
  EXPECT_TRUE(all_equal(gdx, dx));

  // Combine from a buffer with 3 rows past the plan's: its backward must zero them.
  const Tensor yp = integer_tensor({rows + 3, hidden}, 5, -8, 8);
  const Tensor gyp = to_device(gpu, yp);
  const Tensor cw = combine_weights(c.n, c.k, 6);
  const Tensor gcw = to_device(gpu, cw);
  Tensor y = Tensor::empty({c.n, hidden});
  unpermute_combine(cpu_device(), yp, dest_rows, cw, y);
  Tensor gy = poisoned(gpu, {c.n, hidden});
  unpermute_combine(gpu, gyp, gdest, gcw, gy);
  EXPECT_TRUE(all_equal(gy, y));

  const Tensor dy = integer_tensor({c.n, hidden}, 7, -8, 8);
  Tensor dyp = Tensor::empty({rows + 3, hidden});
  Tensor dweights = Tensor::empty({c.n, c.k});
  unpermute_combine_backward(cpu_device(), dy, yp, dest_rows, cw, dyp, dweights);
  Tensor gdyp = poisoned(gpu, {rows + 3, hidden});
  Tensor gdweights = poisoned(gpu, {c.n, c.k});
  unpermute_combine_backward(gpu, to_device(gpu, dy), gyp, gdest, gcw, gdyp, gdweights);
  EXPECT_TRUE(all_equal(gdyp, dyp));
  EXPECT_TRUE(all_equal(gdweights, dweights));
  if (rows > 0) {
    EXPECT_TRUE(any_nonzero(y));
    EXPECT_TRUE(any_nonzero(dweights));
  }
}

// bf16 rows of integers in [-8, 8] (exact, and so are the sums and the weighted sums
// with the binary-fraction weights), or of uniform values, which the two backends may
// round differently after summing in different orders.
Tensor bf16_rows(const Shape& shape, uint64_t seed, bool integers) {
  return as_bf16(integers ? integer_tensor(shape, seed, -8, 8) : random_tensor(shape, seed));
}

TEST_P(PermuteGpu, Bf16RowsMatchCpu) {
  const Case c = GetParam();
  CudaDevice gpu(0);
  const int64_t hidden = 129;
  Tensor tokens_per_expert = Tensor::empty({kExperts}, DType::kI32);
  Tensor dest_rows = Tensor::empty({c.n, c.k}, DType::kI32);
  permute_plan(cpu_device(), routing(c.n, c.k, 1), router_weights(c.n, c.k, 2), kExperts,
               c.capacity, tokens_per_expert, dest_rows);
  const std::vector<int32_t> counts = values_of<int32_t>(tokens_per_expert);
  const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const Tensor gdest = to_device(gpu, dest_rows);
  const Tensor cw = combine_weights(c.n, c.k, 6);
  const Tensor gcw = to_device(gpu, cw);
  for (bool integers : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "integers " << integers);
    // bf16 results: bit for bit on integers, else within bf16's rounding; dweights is f32.
    auto matches = [integers](const Tensor& gpu_result, const Tensor& cpu_result) {
      const double tol = cpu_result.dtype() == DType::kBF16 ? 1.0 / 128 : 1e-4;
      return integers ? all_equal(gpu_result, cpu_result) : all_close(gpu_result, cpu_result, tol);
    };

    const Tensor x = bf16_rows({c.n, hidden}, 3, integers);
    Tensor xp = Tensor::empty({rows, hidden}, DType::kBF16);
    permute_gather(cpu_device(), x, dest_rows, xp);
    Tensor gxp = poisoned(gpu, {rows, hidden}, DType::kBF16);
    permute_gather(gpu, to_device(gpu, x), gdest, gxp);
    EXPECT_TRUE(all_equal(gxp, xp));  // a copy: exact for any values

    Tensor dx = bf16_rows({c.n, hidden}, 4, integers);  // accumulated into
    Tensor gdx = to_device(gpu, dx);
    permute_gather_backward(gpu, to_device(gpu, xp), gdest, gdx);
    permute_gather_backward(cpu_device(), xp, dest_rows, dx);
    EXPECT_TRUE(matches(gdx, dx));

    const Tensor yp = bf16_rows({rows + 3, hidden}, 5, integers);
    const Tensor gyp = to_device(gpu, yp);
    Tensor y = Tensor::empty({c.n, hidden}, DType::kBF16);
    unpermute_combine(cpu_device(), yp, dest_rows, cw, y);
    Tensor gy = poisoned(gpu, {c.n, hidden}, DType::kBF16);
    unpermute_combine(gpu, gyp, gdest, gcw, gy);
    EXPECT_TRUE(matches(gy, y));

    const Tensor dy = bf16_rows({c.n, hidden}, 7, integers);
    Tensor dyp = Tensor::empty({rows + 3, hidden}, DType::kBF16);
    Tensor dweights = Tensor::empty({c.n, c.k});
    unpermute_combine_backward(cpu_device(), dy, yp, dest_rows, cw, dyp, dweights);
    Tensor gdyp = poisoned(gpu, {rows + 3, hidden}, DType::kBF16);
    Tensor gdweights = poisoned(gpu, {c.n, c.k});
    unpermute_combine_backward(gpu, to_device(gpu, dy), gyp, gdest, gcw, gdyp, gdweights);
    EXPECT_TRUE(matches(gdyp, dyp));
    EXPECT_TRUE(matches(gdweights, dweights));
    if (rows > 0) {
      EXPECT_TRUE(any_nonzero(y));
      EXPECT_TRUE(any_nonzero(dweights));
    }
  }
}

// Dropless; capacities that drop many, some and none of the assignments, and all of them;
// a single unsent assignment; more assignments than the blocks of one grid (the combine
// backward loops over them); empty batches.
INSTANTIATE_TEST_SUITE_P(Cases, PermuteGpu,
                         ::testing::Values(Case{301, 3, -1}, Case{301, 3, 17}, Case{301, 3, 80},
                                           Case{301, 3, 1000}, Case{301, 3, 0}, Case{1, 1, -1},
                                           Case{40000, 2, 5000}, Case{0, 2, -1}, Case{0, 2, 4}));

// Expert parallelism's regrouping of received rows: the CPU's places exactly, with empty
// blocks, a source sending nothing, the most counts the kernel takes and no rows at all.
TEST(RegroupGpu, MatchesCpu) {
  CudaDevice gpu(0);
  for (const auto& [sources, experts] : {std::pair{3, 2}, std::pair{8, 16}, std::pair{64, 64}}) {
    SCOPED_TRACE(::testing::Message() << sources << " sources, " << experts << " experts");
    std::vector<int32_t> counts(sources * experts);
    for (size_t b = 0; b < counts.size(); ++b)
      counts[b] = b % 7 == 3 ? 0 : static_cast<int32_t>(b * 29 % 50);
    std::fill(counts.begin() + experts, counts.begin() + 2 * experts, 0);  // source 1 sends none
    const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const Tensor host_counts = host_tensor({sources, experts}, counts);
    Tensor regroup = Tensor::empty({rows, 1}, DType::kI32);
    regroup_received_rows(cpu_device(), host_counts, regroup);
    Tensor gregroup = poisoned(gpu, {rows, 1}, DType::kI32);
    regroup_received_rows(gpu, to_device(gpu, host_counts), gregroup);
    EXPECT_TRUE(all_equal(gregroup, regroup));
  }
  Tensor none = poisoned(gpu, {0, 1}, DType::kI32);
  regroup_received_rows(gpu, to_device(gpu, host_tensor({2, 2}, std::vector<int32_t>(4, 0))), none);
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
