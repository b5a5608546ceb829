#include "core/runtime/json_fields.h"

namespace switchyard {

namespace {

// The deepest nesting of arrays and objects in `text`, strings skipped.
int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

absl::StatusOr<nlohmann::json> parse_json_object(std::string_view text, const std::string& path,
                                                 int max_depth) {
  if (nesting_depth(text) > max_depth)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": nests deeper than ", max_depth, " levels"));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

}  // namespace switchyard
