// Recipe text and `--set` overrides: the input is the textproto, optionally followed by a
// NUL byte and one override ("field.path=value") per line. Parsing (as written, and as a
// saved recipe whose legacy routing is upgraded), overriding, filling defaults, validating
// and summarising a valid recipe must refuse cleanly or succeed.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/config/recipe.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/protobuf_log_trap.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr std::string_view kName = "fuzz.textproto";
  const std::string_view input = sy::fuzz::as_text(data, size);
  const size_t nul = input.find('\0');
  // A weights directory's recipe is read with its legacy routing lines in the new spelling
  // (config::load_saved_recipe): the upgraded text must be refused cleanly or parse too.
  const std::string saved = sy::config::upgrade_legacy_routing_text(input.substr(0, nul));
  sy::fuzz::require_clean_refusal(sy::config::parse_recipe(saved, kName).status(), kName);
  absl::StatusOr<sy::config::Recipe> recipe = sy::config::parse_recipe(input.substr(0, nul), kName);
  sy::fuzz::require_clean_refusal(recipe.status(), kName);
  if (!recipe.ok()) return 0;
  if (nul != std::string_view::npos) {
    std::string_view overrides = input.substr(nul + 1);
    while (!overrides.empty()) {
      const size_t end = std::min(overrides.find('\n'), overrides.size());
      const absl::Status status = sy::config::apply_override(*recipe, overrides.substr(0, end));
      sy::fuzz::require_clean_refusal(status, "");
      if (!status.ok()) return 0;
      overrides.remove_prefix(std::min(end + 1, overrides.size()));
    }
    sy::config::fill_defaults(*recipe);
  }
  const absl::Status valid = sy::config::validate_recipe(*recipe);
  sy::fuzz::require_clean_refusal(valid, "");
  if (!valid.ok()) return 0;
  sy::config::summarize_recipe(*recipe);
  // A valid recipe's pipeline split gives every chunk a layer and covers the model.
  int64_t layers = 0;
  for (const int chunk : sy::config::pipeline_chunk_layers(*recipe)) {
    if (chunk < 1) __builtin_trap();
    layers += chunk;
  }
  if (layers != recipe->model().num_layers()) __builtin_trap();
  return 0;
}
