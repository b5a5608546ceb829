// A Hugging Face config.json made into a recipe (convert from-hf), which must then be a
// valid recipe or refused.
#include <cstdint>

#include "checkpoint/hf_import.h"
#include "core/config/recipe.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/protobuf_log_trap.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "config.json";
  const auto recipe = sy::recipe_from_hf_config_text(sy::fuzz::as_text(data, size), name, "fuzz");
  sy::fuzz::require_clean_refusal(recipe.status(), name);
  if (!recipe.ok()) return 0;
  const absl::Status valid = sy::config::validate_recipe(*recipe);
  sy::fuzz::require_clean_refusal(valid, "");
  if (valid.ok()) sy::config::summarize_recipe(*recipe);
  return 0;
}
