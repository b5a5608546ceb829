// Export of a weights directory (checkpoint/weights.h) as a Hugging Face transformers
// model directory: config.json, generation_config.json, safetensors under transformers'
// tensor names and the SentencePiece tokenizer with its transformers config.
// The target class follows from the recipe: MixtralForCausalLM when every layer is an
// MoE layer without shared experts, Qwen2MoeForCausalLM when there are shared experts.
// Anything the class cannot express is refused before a file is written.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/config/recipe.pb.h"
#include "engine/runtime/tensor.h"

namespace switchyard {

struct HfExportOptions {
  // kF32 or kBF16 (round to nearest even).
  DType dtype = DType::kF32;
  // Above this many bytes of tensor data the weights are split into shards with a
  // model.safetensors.index.json.
  int64_t max_shard_bytes = 5'000'000'000;
};

// Which transformers class `recipe` exports to ("MixtralForCausalLM" or
// "Qwen2MoeForCausalLM"), or why it cannot be exported.
absl::StatusOr<std::string> hf_architecture_for(const config::Recipe& recipe);

// Reads `weights_dir` (recipe.textproto, model.safetensors, optional tokenizer.model) and
// writes the transformers directory `out_dir` (created if missing). The tokenizer files
// name the engine's special pieces (unk 0 "<unk>", bos 1 "<s>", eos 2 "</s>", pad 3
// "<pad>"); the caller checks that tokenizer.model has them, since the tokenizer code
// sits beside this layer, not below it.
absl::Status export_hf(const std::string& weights_dir, const std::string& out_dir,
                       const HfExportOptions& options);

}  // namespace switchyard
