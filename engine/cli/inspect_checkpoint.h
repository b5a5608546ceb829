// `switchyard inspect` on a checkpoint: what it holds, and whether every slice is intact.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace switchyard {

// A step_<N> directory, or a checkpoints directory with a `latest` pointer.
bool is_checkpoint(const std::string& path);

// Prints step, recipe summary, saved layout and the tensors with their sizes, then
// verifies every slice's checksum.
absl::Status inspect_checkpoint(const std::string& path);

}  // namespace switchyard
