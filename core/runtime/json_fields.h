// Typed fields of a JSON file read from untrusted input. Every accessor checks presence,
// type and range and returns an error naming the file and the field
// ("config.json: field num_hidden_layers must be an integer in [1, 4096]") instead of
// letting nlohmann::json throw. Parse with parse_json_object, never with exceptions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace switchyard {

// Parses `text` (the bytes of `path`) as a JSON object, without exceptions and with its
// arrays and objects nested at most `max_depth` deep (strings skipped), so that the
// recursive parser cannot be driven into the stack's end.
inline constexpr int kMaxJsonDepth = 64;
absl::StatusOr<nlohmann::json> parse_json_object(std::string_view text, const std::string& path,
                                                 int max_depth = kMaxJsonDepth);

class JsonFields {
 public:
  using Json = nlohmann::json;
  static constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

  // `object` must outlive this reader; `prefix` goes before every field name
  // ("splits.train[3].").
  JsonFields(const Json& object, std::string path, std::string prefix = "")
      : j_(object), path_(std::move(path)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    const auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  // The field's value (nullptr when absent or null); no type check.
  const Json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  // A nested object or array, as a reader of its own.
  absl::StatusOr<JsonFields> object(const char* key) const {
    const Json* v = find(key);
    if (!v || !v->is_object()) return error(key, "must be an object");
    return JsonFields(*v, path_, absl::StrCat(prefix_, key, "."));
  }
  JsonFields element(const Json& value, const std::string& key, size_t index) const {
    return JsonFields(value, path_, absl::StrCat(prefix_, key, "[", index, "]."));
  }

  // Required integer in [lo, hi].
  absl::StatusOr<int64_t> integer(const char* key, int64_t lo = 0, int64_t hi = kMaxInt) const {
    const Json* v = find(key);
    if (!v || !(v->is_number_integer() || v->is_number_unsigned()) ||
        (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMaxInt)) ||
        v->get<int64_t>() < lo || v->get<int64_t>() > hi)
      return error(key, absl::StrCat("must be an integer in [", lo, ", ", hi, "]"));
    return v->get<int64_t>();
  }
  // Optional integer: `fallback` when absent or null.
  absl::StatusOr<int64_t> integer_or(const char* key, int64_t fallback, int64_t lo = 0,
                                     int64_t hi = kMaxInt) const {
    return has(key) ? integer(key, lo, hi) : fallback;
  }
  // Required finite number in [lo, hi].
  absl::StatusOr<double> number(const char* key,
                                double lo = -std::numeric_limits<double>::max(),
                                double hi = std::numeric_limits<double>::max()) const {
    const Json* v = find(key);
    if (!v || !v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo ||
        v->get<double>() > hi)
      return error(key, absl::StrCat("must be a finite number in [", lo, ", ", hi, "]"));
    return v->get<double>();
  }
  // Optional finite number in [lo, hi].
  absl::StatusOr<double> number_or(const char* key, double fallback,
                                   double lo = -std::numeric_limits<double>::max(),
                                   double hi = std::numeric_limits<double>::max()) const {
    return has(key) ? number(key, lo, hi) : fallback;
  }
  absl::StatusOr<bool> boolean(const char* key) const {
    const Json* v = find(key);
    if (!v || !v->is_boolean()) return error(key, "must be true or false");
    return v->get<bool>();
  }
  absl::StatusOr<bool> boolean_or(const char* key, bool fallback) const {
    return has(key) ? boolean(key) : fallback;
  }
  absl::StatusOr<std::string> string(const char* key) const {
    const Json* v = find(key);
    if (!v || !v->is_string()) return error(key, "must be a string");
    return v->get<std::string>();
  }
  absl::StatusOr<std::string> string_or(const char* key, std::string fallback) const {
    return has(key) ? string(key) : fallback;
  }

  // Says where the value of `key` came from in its errors ("absent: transformers' default
  // 8"), for a field the file leaves out and the reader fills in.
  void note(const std::string& key, std::string text) { notes_[key] = std::move(text); }

  absl::Status error(const std::string& key, const std::string& why) const {
    const auto note = notes_.find(key);
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": field ", prefix_, key, " ", why,
                     note == notes_.end() ? "" : absl::StrCat(" (", note->second, ")")));
  }
  const Json& json() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  const Json& j_;
  std::string path_;
  std::string prefix_;
  std::map<std::string, std::string> notes_;
};

}  // namespace switchyard
