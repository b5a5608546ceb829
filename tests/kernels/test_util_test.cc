// The error measure every kernel test relies on: a non-finite value never passes.
#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace switchyard {
namespace {

using testing::max_relative_error;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

TEST(MaxRelativeError, MeasuresRelativeToTheReferenceAboveOne) {
  EXPECT_DOUBLE_EQ(max_relative_error(std::vector<double>{1.5, 10.5},
                                      std::vector<double>{1.0, 10.0}),
                   0.5);
  EXPECT_DOUBLE_EQ(max_relative_error(std::vector<float>{0.25f}, std::vector<double>{0.0}), 0.25);
}

TEST(MaxRelativeError, AnInfinityInTheResultNeverPasses) {
  EXPECT_EQ(max_relative_error(std::vector<double>{1.0, kInf}, std::vector<double>{1.0, 2.0}),
            kInf);
  EXPECT_EQ(max_relative_error(std::vector<float>{-std::numeric_limits<float>::infinity()},
                               std::vector<double>{3.0}),
            kInf);
}

TEST(MaxRelativeError, AnInfinityInTheReferenceNeverPasses) {
  EXPECT_EQ(max_relative_error(std::vector<double>{1.0}, std::vector<double>{kInf}), kInf);
  EXPECT_EQ(max_relative_error(std::vector<double>{kInf}, std::vector<double>{kInf}), kInf);
}

TEST(MaxRelativeError, NanOrSizeMismatchNeverPasses) {
  EXPECT_EQ(max_relative_error(std::vector<double>{kNan}, std::vector<double>{0.0}), kInf);
  EXPECT_EQ(max_relative_error(std::vector<double>{0.0}, std::vector<double>{kNan}), kInf);
  EXPECT_EQ(max_relative_error(std::vector<double>{0.0}, std::vector<double>{0.0, 0.0}), kInf);
}

}  // namespace
}  // namespace switchyard
