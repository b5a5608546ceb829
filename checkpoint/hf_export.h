// Export of a weights directory (checkpoint/weights.h) as a Hugging Face transformers
// model directory: config.json, generation_config.json, safetensors under transformers'
// tensor names and the SentencePiece tokenizer with its transformers config.
// The target class follows from the recipe: Qwen3MoeForCausalLM with a per-head q/k
// norm, OlmoeForCausalLM with a whole-projection one, else Qwen2MoeForCausalLM when
// there are shared experts and MixtralForCausalLM when there are none. Anything the
// class cannot express is refused before a file is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/tensor.h"

namespace switchyard {

struct HfExportOptions {
  // kF32 or kBF16 (round to nearest even).
  DType dtype = DType::kF32;
  // Above this many bytes of tensor data the weights are split into shards with a
  // model.safetensors.index.json.
  int64_t max_shard_bytes = 5'000'000'000;
};

// Which transformers class `recipe` exports to ("MixtralForCausalLM",
// "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM" or "OlmoeForCausalLM"), or why it cannot
// be exported, naming the recipe field.
absl::StatusOr<std::string> hf_architecture_for(const config::Recipe& recipe);

// Whether `architecture`'s checkpoints hold multi-token prediction modules
// (model.mtp_depth): DeepSeek-V3's, as layers num_layers.. with num_nextn_predict_layers;
// the other families' exports leave them out.
bool hf_mtp_modules_exported(const std::string& architecture);

// Writes the transformers directory `out_dir` (created if missing) for the model
// `recipe` read from `source` (which errors name), each file completely or not at all.
// `weights` are its parameters under registry names as load_model gives them (f32, the
// model's shapes, finite); `tokenizer_path` its tokenizer.model, or empty for none. The
// tokenizer files name the engine's special pieces
// (unk 0 "<unk>", bos 1 "<s>", eos 2 "</s>", pad 3 "<pad>"): a tokenizer.model with other
// ids, or with more pieces than model.vocab_size, is refused before anything is written.
absl::Status export_hf(const std::string& source, const std::string& tokenizer_path,
                       const config::Recipe& recipe, std::map<std::string, Tensor> weights,
                       const std::string& out_dir, const HfExportOptions& options);

// Whether `name` is a file an export writes, or the partial file of one: config.json,
// generation_config.json, model.safetensors, model-NNNNN-of-NNNNN.safetensors,
// model.safetensors.index.json and the tokenizer files (tokenizer.model, tokenizer.json,
// tokenizer_config.json, special_tokens_map.json). `convert to-hf --overwrite` removes
// exactly these.
bool is_hf_export_file(std::string_view name);

}  // namespace switchyard
