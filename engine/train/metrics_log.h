// metrics.jsonl as a resumed run reads it back: the lines up to its checkpoint's step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

// The most bytes metrics.jsonl may have when a run resumes, and the longest line.
inline constexpr int64_t kMaxMetricsFileBytes = int64_t{1} << 30;
inline constexpr size_t kMaxMetricsLineBytes = size_t{1} << 16;

// The lines of `text`, the contents of metrics.jsonl at `path`, that a run resuming
// after step `last_step` keeps: those whose "step" is at most last_step, and those
// without one. An unterminated last line (a write cut short by a kill) is dropped.
// Any other line longer than kMaxMetricsLineBytes, not a JSON object, or with a "step"
// that is not an integer is an error naming the line.
absl::StatusOr<std::vector<std::string>> metrics_lines_up_to(std::string_view text,
                                                             int64_t last_step,
                                                             const std::string& path);

// OK when `text`, the contents of metrics.jsonl at `path`, is one the engine wrote: every
// complete line one of its records (a step's, an evaluation's, a skipped step's, the
// memory line). Otherwise an error naming the first other line: a fresh run, which
// replaces metrics.jsonl, refuses a file it did not write instead of truncating it.
absl::Status check_written_by_engine(std::string_view text, const std::string& path);

}  // namespace switchyard
