// The one loader of saved weights for the commands that read them (eval, sample,
// bench balance, convert to-hf): the model, its parameters on the CPU and its tokenizer,
// from a weights directory, a checkpoint of any layout, or a Hugging Face directory.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "data/tokenizer.h"
#include "engine/model/transformer.h"

namespace switchyard {

struct LoadedModel {
  config::Recipe recipe;
  ParamStore params;
  std::unique_ptr<Transformer> model;
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_path;  // the file `tokenizer` was read from
};

// Whether a model without a tokenizer.model is refused (eval, sample, bench need one) or
// loaded without one (convert to-hf exports what there is).
enum class TokenizerUse { kRequired, kOptional };

// Whether `dir` is one of the directories load_model reads: a weights directory
// (recipe.textproto), a checkpoint (manifest.pb) or a Hugging Face one (config.json).
bool is_model_directory(const std::string& dir);

// Loads `dir` into `out`, whole on this one process, and sets the CPU thread count the
// recipe names:
// - a weights directory (checkpoints/final, `convert from-hf` output);
// - a checkpoint (checkpoints/step_N) of any layout: the parameters gathered from its
//   slices (the optimizer state is not read), the tokenizer of the dataset its recipe
//   names;
// - a Hugging Face directory, imported in memory (nothing is written).
// Every parameter must be present with its shape and finite; errors name the file.
absl::Status load_model(const std::string& dir, LoadedModel& out,
                        TokenizerUse tokenizer_use = TokenizerUse::kRequired);

}  // namespace switchyard
