#include "core/runtime/numbers.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace switchyard {
namespace {

// The text as a refusal shows it: quoted where it is empty or holds whitespace.
std::string shown(absl::string_view text) {
  const bool plain = !text.empty() && std::none_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isspace(static_cast<unsigned char>(c));
  });
  return plain ? std::string(text) : absl::StrCat("\"", text, "\"");
}

// "<field>: <text> <what>".
absl::Status refuse(absl::string_view field, absl::string_view text, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, field.empty() ? "" : ": ", shown(text), " ", what));
}

// Whether `text` is an optional '-' and at least one decimal digit.
bool is_integer_spelling(absl::string_view text) {
  if (absl::StartsWith(text, "-")) text.remove_prefix(1);
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The refusal of an integer outside [min, max]; `negative`: whether its text has a '-'.
absl::Status out_of_range(absl::string_view text, absl::string_view field, bool negative,
                          absl::string_view min, absl::string_view max) {
  if (negative && min == "0") return refuse(field, text, "must be a non-negative integer");
  return refuse(field, text, absl::StrCat("is out of range [", min, ", ", max, "]"));
}

// std::from_chars over `text`: whether it read all of it; `*error` says whether the value
// fits its type.
template <typename T>
bool read_all(absl::string_view text, T* value, std::errc* error) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  *error = ec;
  return ptr == end;
}

std::string format_real(double bound, bool open, bool lower) {
  return lower ? absl::StrFormat("%c%g", open ? '(' : '[', bound)
               : absl::StrFormat("%g%c", bound, open ? ')' : ']');
}

bool in_range(double value, const RealRange& r) {
  const bool above_min = r.min_open ? value > r.min : value >= r.min;
  const bool below_max = r.max_open ? value < r.max : value <= r.max;
  return above_min && below_max;
}

struct Unit {
  const char* name;
  double bytes;
};

// Longest names first, so that "GiB" is not read as "B".
constexpr Unit kUnits[] = {
    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
    {"B", 1}};

// The number of bytes one unit at the end of `*number` names, which is cut off; 1 if none.
double take_unit(absl::string_view* number) {
  for (const Unit& unit : kUnits) {
    if (absl::EndsWithIgnoreCase(*number, unit.name)) {
      number->remove_suffix(absl::string_view(unit.name).size());
      return unit.bytes;
    }
  }
  return 1;
}

}  // namespace

absl::StatusOr<int64_t> parse_int64(absl::string_view text, absl::string_view field, int64_t min,
                                    int64_t max) {
  if (!is_integer_spelling(text)) return refuse(field, text, "is not an integer");
  int64_t value = 0;
  std::errc error{};
  read_all(text, &value, &error);
  if (error != std::errc() || value < min || value > max)
    return out_of_range(text, field, absl::StartsWith(text, "-"), absl::StrCat(min),
                        absl::StrCat(max));
  return value;
}

absl::StatusOr<uint64_t> parse_uint64(absl::string_view text, absl::string_view field,
                                      uint64_t max) {
  if (!is_integer_spelling(text)) return refuse(field, text, "is not an integer");
  const bool negative = absl::StartsWith(text, "-");
  uint64_t value = 0;
  std::errc error{};
  if (!negative) read_all(text, &value, &error);
  if (negative || error != std::errc() || value > max)
    return out_of_range(text, field, negative, "0", absl::StrCat(max));
  return value;
}

absl::StatusOr<double> parse_double(absl::string_view text, absl::string_view field,
                                    const RealRange& range) {
  double value = 0;
  std::errc error{};
  if (!read_all(text, &value, &error) || error == std::errc::invalid_argument)
    return refuse(field, text, "is not a number");
  if (error == std::errc() && !std::isfinite(value))
    return refuse(field, text, "is not a finite number");
  if (error != std::errc() || !in_range(value, range))
    return refuse(field, text,
                  absl::StrCat("is out of range ", format_real(range.min, range.min_open, true),
                               ", ", format_real(range.max, range.max_open, false)));
  return value;
}

absl::StatusOr<int64_t> parse_size_with_units(absl::string_view text, absl::string_view field,
                                              int64_t max_bytes) {
  absl::string_view number = text;
  const double unit = take_unit(&number);
  double value = 0;
  std::errc error{};
  if (number.empty() || !read_all(number, &value, &error) || error != std::errc() ||
      !std::isfinite(value))
    return refuse(field, text, "is not a size (bytes, or with a unit: 500MB, 5GB, 80GiB, 1.5TiB)");
  const double bytes = value * unit;
  if (bytes < 1) return refuse(field, text, "is below one byte");
  // 2^63 and above do not fit an int64_t, where a max_bytes near 2^63 rounds up to it.
  if (bytes > static_cast<double>(max_bytes) || bytes >= 0x1p63)
    return refuse(field, text, absl::StrCat("is more than ", max_bytes, " bytes"));
  return static_cast<int64_t>(bytes);
}

namespace {

// The sum or product of `terms` (`op` " + " or " x "), refused as checked_sum says.
absl::StatusOr<int64_t> combined(std::initializer_list<NamedNumber> terms, absl::string_view op,
                                 int64_t min, int64_t max) {
  int64_t result = op == " + " ? 0 : 1;
  bool overflow = false;
  std::string names, values;
  for (const NamedNumber& term : terms) {
    if (!names.empty()) absl::StrAppend(&names, op);
    if (!values.empty()) absl::StrAppend(&values, op);
    absl::StrAppend(&names, term.name);
    absl::StrAppend(&values, term.value);
    overflow = overflow || (op == " + " ? __builtin_add_overflow(result, term.value, &result)
                                        : __builtin_mul_overflow(result, term.value, &result));
  }
  if (overflow || result < min || result > max)
    return absl::InvalidArgumentError(
        absl::StrCat(names, ": ", values, " is out of range [", min, ", ", max, "]"));
  return result;
}

}  // namespace

absl::StatusOr<int64_t> checked_sum(std::initializer_list<NamedNumber> terms, int64_t min,
                                    int64_t max) {
  return combined(terms, " + ", min, max);
}

absl::StatusOr<int64_t> checked_product(std::initializer_list<NamedNumber> factors, int64_t min,
                                        int64_t max) {
  return combined(factors, " x ", min, max);
}

}  // namespace switchyard
