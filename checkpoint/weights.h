// Final model weights of a run: a directory with the resolved recipe
// (`recipe.textproto`), the fp32 parameters under their registry names
// (`model.safetensors`) and the tokenizer the model was trained with
// (`tokenizer.model`). `switchyard eval` and `switchyard sample` read it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "data/tokenizer.h"

namespace switchyard {

// Writes `tensors` (registry names), copies `tokenizer_path` (may be empty) in as
// tokenizer.model, and writes the recipe last: its presence marks a complete directory.
// Each file is written completely or not at all.
absl::Status save_weights(const std::string& dir, const config::Recipe& recipe,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& tokenizer_path);
absl::StatusOr<config::Recipe> load_weights_recipe(const std::string& dir);
// Whether `name` is a file save_weights writes (recipe.textproto, model.safetensors,
// tokenizer.model) or the partial file of one: what `convert from-hf --overwrite` removes.
bool is_weights_file(std::string_view name);
// Copies the saved tensors into `params` (already allocated); every parameter must be
// present with its shape and finite, and the file must hold nothing else.
absl::Status load_weights(const std::string& dir, ParamStore& params);
// Fills each read's `out` (keys "param/<name>": rows [first_row, first_row + out rows) of
// the tensor, as a checkpoint read takes them) from the weights in `dir`: how a run
// started from weights (train.init_from) loads its part of every parameter under any
// layout, reading only those rows. Each tensor read must be f32 and finite, its rows
// inside it and of the size `out` expects; errors name the file and the tensor.
absl::Status read_weight_rows(const std::string& dir, const std::vector<RowsToRead>& reads);
// The directory's tokenizer.model, whose vocabulary must fit the recipe's.
absl::StatusOr<Tokenizer> load_weights_tokenizer(const std::string& dir,
                                                 const config::Recipe& recipe);

// An error naming `file`, the tensor and its first NaN or infinity ("model.safetensors:
// tensor lm_head.weight holds NaN at element 17"); `t` is f32.
absl::Status check_finite(const Tensor& t, const std::string& file, const std::string& name);
// An error naming both values when the tokenizer at `path` has more pieces than
// model.vocab_size.
absl::Status check_tokenizer_fits(const Tokenizer& tokenizer, const std::string& path,
                                  const config::Recipe& recipe);

}  // namespace switchyard
