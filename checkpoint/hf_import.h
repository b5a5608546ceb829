// Import of a Hugging Face transformers MoE model directory (MixtralForCausalLM,
// Qwen2MoeForCausalLM, OlmoeForCausalLM) as a weights directory (checkpoint/weights.h)
// that `switchyard sample` and `switchyard eval` load. Config fields the engine cannot
// honour are refused by name before anything is written.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/config/recipe.pb.h"

namespace switchyard {

// Reads config.json and model.safetensors (or the shards of
// model.safetensors.index.json; F32, BF16 or F16, per-expert or fused expert tensors)
// from `hf_dir` and writes recipe.textproto, model.safetensors (f32, registry names) and
// tokenizer.model (when `hf_dir` has one) to `out_dir`. Every input is untrusted: shard
// names stay inside `hf_dir`, the model config.json describes must fit in the bytes its
// safetensors files hold before anything is allocated, and non-finite weights are
// refused naming the tensor.
absl::Status import_hf(const std::string& hf_dir, const std::string& out_dir);

// The recipe of a config.json's text (`path` names it in errors; the recipe is called
// `name`). Wrong types, nulls, missing fields and out-of-range values are errors naming
// the field.
absl::StatusOr<config::Recipe> recipe_from_hf_config_text(std::string_view json,
                                                          const std::string& path,
                                                          const std::string& name);

// The weight_map of a model.safetensors.index.json's text: tensor name -> shard file
// name, as written (callers keep the names inside their directory).
absl::StatusOr<std::map<std::string, std::string>> parse_hf_weight_map(std::string_view json,
                                                                       const std::string& path);

}  // namespace switchyard
