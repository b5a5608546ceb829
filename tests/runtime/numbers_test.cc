// The one parser of every number a user types: the spellings it takes and refuses, its
// bounds, and the shape of a refusal ("<field>: <text> <what is wrong>").
#include "core/runtime/numbers.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace switchyard {
namespace {

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

// `parsed` is `value` when `refusal` is empty, else refused with exactly `refusal`.
template <typename T>
void expect_parsed(const absl::StatusOr<T>& parsed, const std::string& text, T value,
                   const std::string& refusal) {
  if (refusal.empty()) {
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    EXPECT_EQ(*parsed, value) << text;
  } else {
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().message(), refusal);
  }
}

struct IntCase {
  std::string text;
  int64_t min, max;
  int64_t value;        // when accepted
  std::string refusal;  // the whole message, empty when accepted
};

TEST(NumbersTest, Int64) {
  const IntCase cases[] = {
      {"42", 1, 100, 42, ""},
      {"-7", -10, 10, -7, ""},
      {"010", 0, 100, 10, ""},  // decimal, not octal
      {"0", 0, 0, 0, ""},
      {"9223372036854775807", kMin64, kMax64, kMax64, ""},
      {"-9223372036854775808", kMin64, kMax64, kMin64, ""},
      {"9223372036854775808", kMin64, kMax64, 0,
       "f: 9223372036854775808 is out of range [-9223372036854775808, 9223372036854775807]"},
      {"99999999999999999999", 1, 1048576, 0,
       "f: 99999999999999999999 is out of range [1, 1048576]"},
      {"0", 1, 5, 0, "f: 0 is out of range [1, 5]"},
      {"-1", 0, 5, 0, "f: -1 must be a non-negative integer"},
      {"-99999999999999999999", 0, 5, 0, "f: -99999999999999999999 must be a non-negative integer"},
      {"-3", 1, 5, 0, "f: -3 is out of range [1, 5]"},
      {"+5", 0, 10, 0, "f: +5 is not an integer"},
      {" 5", 0, 10, 0, "f: \" 5\" is not an integer"},
      {"5 ", 0, 10, 0, "f: \"5 \" is not an integer"},
      {"", 0, 10, 0, "f: \"\" is not an integer"},
      {"-", 0, 10, 0, "f: - is not an integer"},
      {"0x10", 0, 100, 0, "f: 0x10 is not an integer"},
      {"1e3", 0, 10000, 0, "f: 1e3 is not an integer"},
      {"2.0", 0, 10, 0, "f: 2.0 is not an integer"},
      {"12abc", 0, 100, 0, "f: 12abc is not an integer"},
  };
  for (const IntCase& c : cases)
    expect_parsed(parse_int64(c.text, "f", c.min, c.max), c.text, c.value, c.refusal);
}

TEST(NumbersTest, Uint64TakesEverySeed) {
  EXPECT_EQ(*parse_uint64("18446744073709551615", "train.seed"),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*parse_uint64("0", "train.seed"), 0u);
  EXPECT_EQ(parse_uint64("-1", "train.seed").status().message(),
            "train.seed: -1 must be a non-negative integer");
  EXPECT_EQ(parse_uint64("18446744073709551616", "--seed").status().message(),
            "--seed: 18446744073709551616 is out of range [0, 18446744073709551615]");
  EXPECT_EQ(parse_uint64("70000", "f", 65535).status().message(),
            "f: 70000 is out of range [0, 65535]");
  EXPECT_EQ(parse_uint64("0x10", "f").status().message(), "f: 0x10 is not an integer");
}

struct RealCase {
  std::string text;
  RealRange range;
  double value;
  std::string refusal;
};

TEST(NumbersTest, Double) {
  const RealRange any = {-1e300, 1e300};
  const RealRange unit_open_below = {0, 1, true, false};
  const RealRange unit_open_above = {0, 1, false, true};
  const RealCase cases[] = {
      {"1.5", any, 1.5, ""},
      {".5", any, 0.5, ""},
      {"-2e-3", any, -2e-3, ""},
      {"1e3", any, 1000, ""},
      {"1", unit_open_below, 1, ""},
      {"0", unit_open_above, 0, ""},
      {"0", unit_open_below, 0, "f: 0 is out of range (0, 1]"},
      {"1", unit_open_above, 0, "f: 1 is out of range [0, 1)"},
      {"-1", {0, 1e12}, 0, "f: -1 is out of range [0, 1e+12]"},
      {"1e999", any, 0, "f: 1e999 is out of range [-1e+300, 1e+300]"},
      {"nan", any, 0, "f: nan is not a finite number"},
      {"inf", any, 0, "f: inf is not a finite number"},
      {"-Infinity", any, 0, "f: -Infinity is not a finite number"},
      {"+1", any, 0, "f: +1 is not a number"},
      {" 1", any, 0, "f: \" 1\" is not a number"},
      {"1 ", any, 0, "f: \"1 \" is not a number"},
      {"", any, 0, "f: \"\" is not a number"},
      {"0x1p3", any, 0, "f: 0x1p3 is not a number"},
      {"1.5x", any, 0, "f: 1.5x is not a number"},
      {"four", any, 0, "f: four is not a number"},
  };
  for (const RealCase& c : cases)
    expect_parsed(parse_double(c.text, "f", c.range), c.text, c.value, c.refusal);
}

TEST(NumbersTest, SizeWithUnits) {
  const std::pair<std::string, int64_t> accepted[] = {{"80GiB", int64_t{80} << 30},
                                                      {"80GB", 80'000'000'000},
                                                      {"5gb", 5'000'000'000},
                                                      {"500MB", 500'000'000},
                                                      {"1.5KiB", 1536},
                                                      {"2kB", 2000},
                                                      {"8.5e10", 85'000'000'000},
                                                      {"1B", 1},
                                                      {"1.7", 1},
                                                      {"1TiB", int64_t{1} << 40}};
  for (const auto& [text, bytes] : accepted) {
    const absl::StatusOr<int64_t> v = parse_size_with_units(text, "--device-memory");
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, bytes) << text;
  }
  const std::pair<std::string, std::string> refused[] = {
      {"0.5B", "--device-memory: 0.5B is below one byte"},
      {"0", "--device-memory: 0 is below one byte"},
      {"-5GB", "--device-memory: -5GB is below one byte"},
      {"GB",
       "--device-memory: GB is not a size (bytes, or with a unit: 500MB, 5GB, 80GiB, "
       "1.5TiB)"},
      {"nan",
       "--device-memory: nan is not a size (bytes, or with a unit: 500MB, 5GB, 80GiB, "
       "1.5TiB)"},
      {"5 GB",
       "--device-memory: \"5 GB\" is not a size (bytes, or with a unit: 500MB, 5GB, "
       "80GiB, 1.5TiB)"},
      {"1e30", "--device-memory: 1e30 is more than 1152921504606846976 bytes"},
  };
  for (const auto& [text, message] : refused)
    EXPECT_EQ(parse_size_with_units(text, "--device-memory").status().message(), message);
}

TEST(NumbersTest, AnEmptyFieldLeavesTheNameToTheCaller) {
  EXPECT_EQ(parse_int64("7", "", 1, 5).status().message(), "7 is out of range [1, 5]");
}

// A sum or product of user numbers is refused in the parsers' shape when it leaves its
// range or int64, never wrapped.
TEST(NumbersTest, SumsAndProductsChecked) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*checked_sum({{"--prompt's tokens", 5}, {"--tokens", 27}}, 1, 32), 32);
  EXPECT_EQ(checked_sum({{"--prompt's tokens", 5}, {"--tokens", 28}}, 1, 32).status().message(),
            "--prompt's tokens + --tokens: 5 + 28 is out of range [1, 32]");
  EXPECT_EQ(checked_sum({{"a", kMax}, {"b", 1}}, 0, kMax).status().message(),
            "a + b: 9223372036854775807 + 1 is out of range [0, 9223372036854775807]");
  EXPECT_EQ(*checked_product({{"a", 1 << 20}, {"b", 1 << 20}, {"c", 1 << 20}}, 0, kMax),
            int64_t{1} << 60);
  EXPECT_EQ(
      checked_product({{"train.steps", int64_t{1} << 62}, {"batch", 4}, {"seq", 32}}, 0, kMax)
          .status()
          .message(),
      "train.steps x batch x seq: 4611686018427387904 x 4 x 32 is out of range [0, "
      "9223372036854775807]");
  EXPECT_EQ(checked_product({{"a", 0}, {"b", kMax}}, 1, 10).status().message(),
            "a x b: 0 x 9223372036854775807 is out of range [1, 10]");
}

}  // namespace
}  // namespace switchyard
