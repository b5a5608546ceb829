// Import of a Hugging Face transformers MoE model directory (MixtralForCausalLM,
// Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, DeepseekV3ForCausalLM) as a weights directory (checkpoint/weights.h)
// that `switchyard sample` and `switchyard eval` load, and of a dense one
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) to be upcycled. Config fields the engine cannot
// honour are refused by name before anything is written.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// A transformers directory read as the engine's model: its recipe, its weights under
// registry names (f32) and its tokenizer.model (empty when it has none).
struct HfModel {
  config::Recipe recipe;
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::string tokenizer_path;
};

// Reads config.json and model.safetensors (or the shards of
// model.safetensors.index.json; F32, BF16 or F16, per-expert or fused expert tensors)
// from `hf_dir`; save_weights writes the result as a weights directory. Every input is
// untrusted: shard names stay inside `hf_dir`, the model config.json describes must fit
// in the bytes its safetensors files hold before anything is allocated, and non-finite
// weights are refused naming the tensor.
absl::StatusOr<HfModel> read_hf_model(const std::string& hf_dir);

// Reads a dense Llama, Mistral or Qwen2 directory with the checks of read_hf_model: a
// recipe with every layer a dense FFN (model.moe_layer_interval 0), which
// checkpoint/upcycle.h makes a mixture of experts of.
absl::StatusOr<HfModel> read_hf_dense_model(const std::string& hf_dir);

// The recipe of a config.json's text, MoE or dense (`path` names it in errors; the recipe
// is called `name`). Wrong types, nulls, missing fields and out-of-range values are errors naming
// the field.
absl::StatusOr<config::Recipe> recipe_from_hf_config_text(std::string_view json,
                                                          const std::string& path,
                                                          const std::string& name);

// DeepSeek-V3 checkpoints (transformers' rope_interleave) lay each head's rotary
// channels out in pairs (x0, x1), (x2, x3), ...; the engine rotates halves (x_i with
// x_{i + rope/2}), which gives the same attention when the rows are reordered: rows
// [offset, offset + rope) of every block of `block` rows of an f32 (rows, cols) weight,
// from interleaved to halves, or back when `to_interleaved`.
Tensor reorder_rope_rows(const Tensor& weight, int64_t block, int64_t offset, int64_t rope,
                         bool to_interleaved);

// The weight_map of a model.safetensors.index.json's text: tensor name -> shard file
// name, as written (callers keep the names inside their directory).
absl::StatusOr<std::map<std::string, std::string>> parse_hf_weight_map(std::string_view json,
                                                                       const std::string& path);

}  // namespace switchyard
