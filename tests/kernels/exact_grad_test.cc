// Exact sums of gradient parts: one rounding of the exact sum, the same bits in every
// order and split over ledgers added as integers (an all-reduce), faults that survive.
#include "kernels/exact_grad.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "tests/tensor_test_util.h"

namespace switchyard {
namespace {

using testing::host_tensor;

Tensor ledger_for(int64_t n) { return Tensor::zeros({exact_grad_ledger_size(n)}, DType::kI64); }

std::vector<float> read(const Tensor& ledger, int64_t n) {
  Tensor out = Tensor::empty({n}, DType::kF32);
  exact_grad_read(cpu_device(), ledger, out);
  return std::vector<float>(out.data<float>(), out.data<float>() + n);
}

void add(Tensor& ledger, const std::vector<float>& part) {
  exact_grad_add(cpu_device(), host_tensor<float>({static_cast<int64_t>(part.size())}, part),
                 ledger);
}

TEST(ExactGradTest, TheSumIsRoundedOnceInAnyOrderAndSplit) {
  // Parts k * 2^-20 (|k| < 2^24): their exact sums fit a double, whose one rounding to
  // f32 is the reference. Each of 64 elements gets 300 parts.
  constexpr int64_t kElements = 64, kParts = 300;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> k(-(1 << 24) + 1, (1 << 24) - 1);
  std::vector<std::vector<float>> parts(kParts, std::vector<float>(kElements));
  std::vector<double> exact(kElements, 0.0);
  for (auto& part : parts)
    for (int64_t i = 0; i < kElements; ++i) {
      part[i] = std::ldexp(static_cast<float>(k(rng)), -20);
      exact[i] += static_cast<double>(part[i]);
    }
  Tensor whole = ledger_for(kElements);
  for (const auto& part : parts) add(whole, part);
  const std::vector<float> sums = read(whole, kElements);
  for (int64_t i = 0; i < kElements; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(sums[i]),
              std::bit_cast<uint32_t>(static_cast<float>(exact[i])));

  // Shuffled, and split over three ledgers whose integers are then added.
  std::shuffle(parts.begin(), parts.end(), rng);
  std::vector<Tensor> ranks = {ledger_for(kElements), ledger_for(kElements), ledger_for(kElements)};
  for (size_t p = 0; p < parts.size(); ++p) add(ranks[p % 3], parts[p]);
  Tensor reduced = ledger_for(kElements);
  for (const Tensor& r : ranks)
    for (int64_t i = 0; i < reduced.numel(); ++i)
      reduced.data<int64_t>()[i] += r.data<int64_t>()[i];
  EXPECT_EQ(read(reduced, kElements), sums);
}

TEST(ExactGradTest, PartsAreRoundedToUnitsOfTwoToTheMinus64) {
  const float unit = std::ldexp(1.0f, -64);
  Tensor ledger = ledger_for(5);
  add(ledger, {std::ldexp(1.0f, -66), 1.5f * unit, 2.5f * unit, 3.0f * std::ldexp(1.0f, -41),
               -std::ldexp(1.0f, -90)});
  EXPECT_EQ(read(ledger, 5),
            (std::vector<float>{0.0f, 2 * unit, 2 * unit, 3.0f * std::ldexp(1.0f, -41), 0.0f}));
  // The largest part in range, and its negation, cancel exactly.
  Tensor big = ledger_for(1);
  add(big, {std::nextafter(std::ldexp(1.0f, 32), 0.0f)});
  add(big, {1.0f});
  add(big, {-std::nextafter(std::ldexp(1.0f, 32), 0.0f)});
  EXPECT_EQ(read(big, 1), std::vector<float>{1.0f});
}

TEST(ExactGradTest, APartNotFiniteOrOutOfRangeFailsTheWholeSum) {
  Tensor nan = ledger_for(2);
  add(nan, {1.0f, NAN});
  for (float v : read(nan, 2)) EXPECT_TRUE(std::isnan(v));
  Tensor huge = ledger_for(2);
  add(huge, {std::ldexp(1.0f, 32), 1.0f});
  EXPECT_EQ(read(huge, 2), (std::vector<float>{INFINITY, INFINITY}));
  Tensor inf = ledger_for(1);
  add(inf, {-INFINITY});
  EXPECT_EQ(read(inf, 1), std::vector<float>{INFINITY});
}

}  // namespace
}  // namespace switchyard
