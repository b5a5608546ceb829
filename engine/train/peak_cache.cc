#include "engine/train/peak_cache.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/text.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// The GFLOP/s of `entry` of the cache, or an error naming the field.
absl::StatusOr<double> cache_entry_gflops(const JsonFields& cache, const std::string& key) {
  absl::StatusOr<JsonFields> entry = cache.object(key.c_str());
  if (!entry.ok()) return entry.status();
  absl::StatusOr<double> gflops = entry->number_or("gflops", 0, 0, 1e9);
  if (!gflops.ok()) return gflops.status();
  if (*gflops <= 0) return entry->error("gflops", "must be a number > 0");
  return *gflops;
}

// The warning a damaged cache gives, and the empty cache it reads as.
PeakCache refuse_cache(const absl::Status& status, std::string* warning) {
  *warning = escape_control_bytes(
      absl::StrCat("warning: ", status.message(), "; measuring the peak again"));
  return PeakCache{};
}

}  // namespace

PeakCache read_peak_cache(const std::string& path, std::string* warning) {
  warning->clear();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return {};
  absl::StatusOr<std::string> text = read_file(path, kMaxPeakCacheBytes);
  if (!text.ok()) return refuse_cache(text.status(), warning);
  return parse_peak_cache(*text, path, warning);
}

PeakCache parse_peak_cache(std::string_view text, const std::string& path, std::string* warning) {
  warning->clear();
  const auto refuse = [&](const absl::Status& status) { return refuse_cache(status, warning); };
  absl::StatusOr<nlohmann::json> json = parse_json_object(text, path);
  if (!json.ok()) return refuse(json.status());
  if (json->size() > kMaxPeakCacheEntries)
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        path, ": holds ", json->size(), " entries, more than ", kMaxPeakCacheEntries)));
  const JsonFields fields(*json, path);
  PeakCache cache;
  for (const auto& [key, value] : json->items()) {
    absl::StatusOr<double> gflops = cache_entry_gflops(fields, key);
    if (!gflops.ok()) return refuse(gflops.status());
    cache[key] = *gflops;
  }
  return cache;
}

absl::Status write_peak_cache(const std::string& path, const PeakCache& cache) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const auto& [key, gflops] : cache) json[key] = {{"gflops", gflops}};
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create its directory: ", ec.message()));
  return write_file_atomically(path, json.dump(2) + "\n");
}

}  // namespace switchyard
