// The one loader of saved weights for the commands that read them (eval, sample,
// bench balance, convert to-hf): the model, its parameters on the CPU and its tokenizer.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "data/tokenizer.h"
#include "engine/config/recipe.pb.h"
#include "engine/model/transformer.h"
#include "engine/runtime/param_store.h"

namespace switchyard {

struct LoadedModel {
  config::Recipe recipe;
  ParamStore params;
  std::unique_ptr<Transformer> model;
  std::optional<Tokenizer> tokenizer;
};

// Loads the weights directory `dir` into `out`; sets the CPU thread count the recipe
// names.
absl::Status load_model(const std::string& dir, LoadedModel& out);

}  // namespace switchyard
