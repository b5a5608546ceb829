// Final model weights of a run: a directory with the resolved recipe
// (`recipe.textproto`), the fp32 parameters under their registry names
// (`model.safetensors`) and the tokenizer the model was trained with
// (`tokenizer.model`). `switchyard eval` and `switchyard sample` read it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/config/recipe.pb.h"
#include "engine/runtime/param_store.h"

namespace switchyard {

// Writes `tensors` (registry names), copies `tokenizer_path` (may be empty) in as
// tokenizer.model, and writes the recipe last: its presence marks a complete directory.
absl::Status save_weights(const std::string& dir, const config::Recipe& recipe,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& tokenizer_path);
absl::StatusOr<config::Recipe> load_weights_recipe(const std::string& dir);
// Copies the saved tensors into `params` (already allocated); every parameter must be
// present with its shape, and the file must hold nothing else.
absl::Status load_weights(const std::string& dir, ParamStore& params);

}  // namespace switchyard
