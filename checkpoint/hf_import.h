// Import of a Hugging Face transformers MoE model directory (MixtralForCausalLM,
// Qwen2MoeForCausalLM, OlmoeForCausalLM) as a weights directory (checkpoint/weights.h)
// that `switchyard sample` and `switchyard eval` load. Config fields the engine cannot
// honour are refused by name before anything is written.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace switchyard {

// Reads config.json and model.safetensors (or the shards of
// model.safetensors.index.json; F32, BF16 or F16, per-expert or fused expert tensors)
// from `hf_dir` and writes recipe.textproto, model.safetensors (f32, registry names) and
// tokenizer.model (when `hf_dir` has one) to `out_dir`.
absl::Status import_hf(const std::string& hf_dir, const std::string& out_dir);

}  // namespace switchyard
