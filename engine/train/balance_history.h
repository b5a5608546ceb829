// Each MoE layer's load imbalance over a training run, read back from its metrics.jsonl
// (`bench balance --run-dir`): training writes `layer_imbalance`, max / mean tokens per
// expert of every MoE layer in the logged step's last micro-batch, on each log line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

// The most MoE layers a line may list.
inline constexpr int64_t kMaxHistoryLayers = 4096;

struct ImbalanceHistory {
  std::vector<int64_t> steps;               // of the lines with layer_imbalance, in file order
  std::vector<std::vector<double>> layers;  // layers[l][i]: layer l at steps[i]
};

// The history in `text`, the contents of metrics.jsonl at `path`. Lines without
// layer_imbalance (evaluations, older runs) are skipped, as is an unterminated last line.
// A line that is not a JSON object, has no integer step, or whose layer_imbalance is not
// an array of 1 to kMaxHistoryLayers finite numbers >= 0 of the same length as the first
// one is an error naming the line.
absl::StatusOr<ImbalanceHistory> read_imbalance_history(std::string_view text,
                                                        const std::string& path);

}  // namespace switchyard
