#include "engine/train/balance_history.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"
#include "engine/train/metrics_log.h"

namespace switchyard {

namespace {

// A metrics line is flat: an object of numbers, strings and one level of arrays/objects.
constexpr int kMaxLineDepth = 4;

// The layer imbalances of one line (empty when it has none), or an error naming it.
absl::StatusOr<std::vector<double>> line_imbalance(const nlohmann::json& line, size_t number,
                                                   const std::string& path) {
  const auto it = line.find("layer_imbalance");
  if (it == line.end() || it->is_null()) return std::vector<double>();
  const auto refuse = absl::DataLossError(
      absl::StrCat(path, ": line ", number, " field layer_imbalance must be an array of 1 to ",
                   kMaxHistoryLayers, " finite numbers >= 0"));
  if (!it->is_array() || it->empty() || static_cast<int64_t>(it->size()) > kMaxHistoryLayers)
    return refuse;
  std::vector<double> values;
  for (const nlohmann::json& v : *it) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) return refuse;
    values.push_back(v.get<double>());
  }
  return values;
}

}  // namespace

absl::StatusOr<ImbalanceHistory> read_imbalance_history(std::string_view text,
                                                        const std::string& path) {
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> lines,
                      metrics_lines_up_to(text, std::numeric_limits<int64_t>::max(), path));
  ImbalanceHistory history;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t number = i + 1;
    SY_ASSIGN_OR_RETURN(
        const nlohmann::json line,
        parse_json_object(lines[i], absl::StrCat(path, ": line ", number), kMaxLineDepth));
    SY_ASSIGN_OR_RETURN(const std::vector<double> values, line_imbalance(line, number, path));
    if (values.empty()) continue;
    const auto step = line.find("step");
    if (step == line.end() || !step->is_number_integer())
      return absl::DataLossError(
          absl::StrCat(path, ": line ", number, " has layer_imbalance but no integer step"));
    if (history.layers.empty()) history.layers.resize(values.size());
    if (values.size() != history.layers.size())
      return absl::DataLossError(absl::StrCat(path, ": line ", number, " lists ", values.size(),
                                              " layers in layer_imbalance, the first line ",
                                              history.layers.size()));
    history.steps.push_back(step->get<int64_t>());
    for (size_t l = 0; l < values.size(); ++l) history.layers[l].push_back(values[l]);
  }
  return history;
}

}  // namespace switchyard
