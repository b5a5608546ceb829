#include "engine/cli/number_flags.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace switchyard {
namespace {

// What a CLI11 validator returns: "" for an accepted value, else the refusal. With
// `canonical`, an accepted value replaces `text` in plain decimal.
template <typename T>
std::string verdict(const absl::StatusOr<T>& value, std::string& text, bool canonical) {
  if (!value.ok()) return std::string(value.status().message());
  if (canonical) text = absl::StrCat(*value);
  return "";
}

}  // namespace

CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        return verdict(parse_int64(text, "", min, max), text, /*canonical=*/true);
      },
      "");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) { return verdict(parse_uint64(text, ""), text, /*canonical=*/true); },
      "");
}

CLI::Validator real_in(const RealRange& range) {
  return CLI::Validator(
      [range](std::string& text) {
        return verdict(parse_double(text, "", range), text, /*canonical=*/false);
      },
      "");
}

CLI::Validator size_with_units() {
  return CLI::Validator(
      [](std::string& text) {
        return verdict(parse_size_with_units(text, ""), text, /*canonical=*/false);
      },
      "");
}

}  // namespace switchyard
