// Runs that start from weights (train.init_from) and freeze parts of the model
// (train.freeze).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "engine/train/trainer.h"

namespace switchyard {

// The weights a run's first start loads (train.init_from) and their tokenizer, which the
// run tokenises with.
struct InitWeights {
  std::string dir;
  std::string tokenizer_path;
  std::string tokenizer_sha256;
};

// train.init_from's weights (none without it): their recipe must describe the recipe's
// model, field by field, but for the settings that neither shape nor define it.
absl::StatusOr<std::optional<InitWeights>> open_init_weights(const config::Recipe& recipe);

// Marks the parameters train.freeze names as frozen; an entry that names none is refused.
// With pipeline stages each rank freezes what it holds, and the counts are the whole
// model's, summed over `pipeline` (a collective over it).
absl::Status apply_freeze(const config::TrainConfig& tc, ParamStore& params,
                          Communicator& pipeline, ProgressSink& sink);

}  // namespace switchyard
