// safetensors files: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runtime/tensor.h"

namespace switchyard {

// Writes tensors (CPU, f32/i32/i64/u8/bf16/f16) in the given order, to `path`.tmp first,
// then renames, so a crash never leaves a half-written file under the final name.
absl::Status write_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a file into CPU tensors. Errors name the file and what is wrong
// (truncated, bad header, overlapping or out-of-range offsets, unknown dtype).
absl::StatusOr<std::map<std::string, Tensor>> read_safetensors(const std::string& path);

}  // namespace switchyard
