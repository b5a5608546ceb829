// ExactSum: the correctly rounded sum of doubles, the same bits in every order, grouping
// and split over "ranks" (limbs added as integers).
#include "core/runtime/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace switchyard {
namespace {

double exact_sum(const std::vector<double>& values) {
  ExactSum sum;
  for (double v : values) sum.add(v);
  return sum.value();
}

uint64_t bits(double v) { return std::bit_cast<uint64_t>(v); }

TEST(ExactSumTest, CancellationAndRoundingAreThoseOfTheExactSum) {
  EXPECT_EQ(exact_sum({1e300, 1.0, -1e300}), 1.0);
  EXPECT_EQ(exact_sum({1.0, 1e-300, -1.0}), 1e-300);
  // Ten 0.1s add up to 1 + 5.6e-17, which rounds to 1; a left-to-right double sum does not.
  EXPECT_EQ(exact_sum(std::vector<double>(10, 0.1)), 1.0);
  EXPECT_EQ(exact_sum({}), 0.0);
  EXPECT_EQ(exact_sum({-2.5, 0.5}), -2.0);
  const double tiny = std::numeric_limits<double>::denorm_min();
  EXPECT_EQ(exact_sum({tiny, tiny, -tiny}), tiny);
  const double max = std::numeric_limits<double>::max();
  EXPECT_EQ(exact_sum({max, max, -max}), max);
  EXPECT_EQ(exact_sum({max, max}), std::numeric_limits<double>::infinity());
}

TEST(ExactSumTest, MatchesAnIntegerReferenceRoundedOnce) {
  // Values k * 2^e (|k| < 2^50, e in [-30, 10]) are integers in units of 2^-30, whose
  // exact sum an __int128 holds; its one conversion to double is correctly rounded.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> mantissa(-(int64_t{1} << 50), int64_t{1} << 50);
  std::uniform_int_distribution<int> exponent(-30, 10);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> values;
    __int128 reference = 0;
    for (int i = 0; i < 1000; ++i) {
      const int64_t k = mantissa(rng);
      const int e = exponent(rng);
      values.push_back(std::ldexp(static_cast<double>(k), e));
      reference += static_cast<__int128>(k) * (static_cast<__int128>(1) << (e + 30));
    }
    const double expected = std::ldexp(static_cast<double>(reference), -30);
    EXPECT_EQ(bits(exact_sum(values)), bits(expected)) << "trial " << trial;
  }
}

TEST(ExactSumTest, EveryOrderGroupingAndSplitGivesTheSameBits) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-200, 200);
  std::vector<double> values;
  for (int i = 0; i < 5000; ++i) values.push_back(std::ldexp(unit(rng), exponent(rng)));
  const double expected = exact_sum(values);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(values.begin(), values.end(), rng);
    // Four "ranks" each sum a part; their limbs are added as integers, as an all-reduce does.
    const size_t cut = values.size() / 4;
    std::vector<ExactSum> ranks(4);
    for (size_t i = 0; i < values.size(); ++i) ranks[std::min<size_t>(i / cut, 3)].add(values[i]);
    ExactSum reduced;
    for (ExactSum& rank : ranks) {
      const int64_t* limbs = rank.limbs();
      int64_t* total = reduced.limbs();
      for (int i = 0; i < ExactSum::kSize; ++i) total[i] += limbs[i];
    }
    EXPECT_EQ(bits(reduced.value()), bits(expected));
    ExactSum merged;
    for (const ExactSum& rank : ranks) merged.add(rank);
    EXPECT_EQ(bits(merged.value()), bits(expected));
  }
}

TEST(ExactSumTest, NonFiniteValuesDecideTheSum) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(exact_sum({1.0, inf}), inf);
  EXPECT_EQ(exact_sum({-inf, 1.0}), -inf);
  EXPECT_TRUE(std::isnan(exact_sum({inf, -inf})));
  EXPECT_TRUE(std::isnan(exact_sum({1.0, nan})));
}

}  // namespace
}  // namespace switchyard
