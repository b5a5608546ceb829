#include "engine/train/metrics_log.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace switchyard {

namespace {

// The step of one line (-1 when it has none), or an error naming the line.
absl::StatusOr<int64_t> line_step(std::string_view line, size_t number, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": line ", number, " ", why));
  };
  if (line.size() > kMaxMetricsLineBytes)
    return refuse(absl::StrCat("is longer than ", kMaxMetricsLineBytes, " bytes"));
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return refuse("is not a JSON object");
  const auto step = j.find("step");
  if (step == j.end()) return -1;
  if (!step->is_number_integer() || step->get<int64_t>() < 0)
    return refuse("field step must be a non-negative integer");
  return step->get<int64_t>();
}

// Whether `line` is a record the engine writes: a JSON object with an integer step and a
// loss, val_loss or skipped field, or the memory line.
bool is_engine_record(std::string_view line) {
  if (line.size() > kMaxMetricsLineBytes) return false;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  if (j.contains("memory_bytes")) return j["memory_bytes"].is_object();
  const auto step = j.find("step");
  return step != j.end() && step->is_number_integer() &&
         (j.contains("loss") || j.contains("val_loss") || j.contains("skipped"));
}

}  // namespace

absl::Status check_written_by_engine(std::string_view text, const std::string& path) {
  size_t begin = 0;
  for (size_t number = 1;; ++number) {
    const size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) return absl::OkStatus();  // a torn last line
    if (!is_engine_record(text.substr(begin, end - begin)))
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": was not written by switchyard (line ", number,
          " is not one of its records), and a fresh run would replace it: move it away, or "
          "choose another --run-dir"));
    begin = end + 1;
  }
}

absl::StatusOr<std::vector<std::string>> metrics_lines_up_to(std::string_view text,
                                                             int64_t last_step,
                                                             const std::string& path) {
  std::vector<std::string> kept;
  size_t begin = 0;
  for (size_t number = 1;; ++number) {
    const size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) break;  // the torn or empty remainder
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    absl::StatusOr<int64_t> step = line_step(line, number, path);
    if (!step.ok()) return step.status();
    if (*step <= last_step) kept.emplace_back(line);
  }
  return kept;
}

}  // namespace switchyard
