// Small file helpers with errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace switchyard {

absl::StatusOr<std::string> read_file(const std::string& path);
// Writes `path` + ".partial", fsyncs it and renames it over `path`.
absl::Status write_file_atomically(const std::string& path, std::string_view bytes);
// Flushes a written file (or directory) to disk.
absl::Status fsync_path(const std::string& path);
// Sum of the files' sizes; an error names the first that is missing.
absl::StatusOr<int64_t> total_file_bytes(const std::vector<std::string>& paths);

}  // namespace switchyard
