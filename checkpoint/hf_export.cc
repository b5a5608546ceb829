#include "checkpoint/hf_export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/tokenizer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

constexpr char kMixtral[] = "MixtralForCausalLM";
constexpr char kQwen2Moe[] = "Qwen2MoeForCausalLM";
constexpr char kQwen3Moe[] = "Qwen3MoeForCausalLM";
constexpr char kOlmoe[] = "OlmoeForCausalLM";
constexpr char kDeepseekV3[] = "DeepseekV3ForCausalLM";

// The shortest decimal that reads back as the same float, as a double: the recipe holds
// floats, and 1e-5f printed as a double would be 9.999999747378752e-06.
double json_float(float value) {
  for (int precision = 6; precision < 9; ++precision) {
    const double d = std::strtod(absl::StrFormat("%.*g", precision, value).c_str(), nullptr);
    if (static_cast<float>(d) == value) return d;
  }
  return value;
}

Tensor cast(const Tensor& f32, DType dtype) {
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::empty(f32.shape(), DType::kBF16);
  const float* src = f32.data<float>();
  bf16* dst = out.data<bf16>();
  for (int64_t i = 0; i < f32.numel(); ++i) dst[i] = to_bf16(src[i]);
  return out;
}

// A copy of the shape.numel() contiguous elements of `src` from element `begin` on.
Tensor copy_range(const Tensor& src, int64_t begin, const Shape& shape) {
  Tensor out = Tensor::empty(shape, DType::kF32);
  std::memcpy(out.raw_data(), src.data<float>() + begin, out.nbytes());
  return out;
}

absl::Status write_json(const std::string& path, const Json& json) {
  return write_file_atomically(path, json.dump(2) + "\n");
}

std::string torch_dtype_name(DType dtype) { return dtype == DType::kBF16 ? "bfloat16" : "float32"; }

// The Qwen families' layer pattern: decoder_sparse_step and the dense first layers.
void write_layer_pattern(const config::ModelConfig& model, Json& j) {
  j["decoder_sparse_step"] = model.moe_layer_interval();
  Json dense = Json::array();
  for (int i = 0; i < model.first_dense_layers() && i < model.num_layers(); ++i) dense.push_back(i);
  j["mlp_only_layers"] = dense;
}

// DeepSeek-V3's fields: latent attention (its rotary rows exported interleaved), dense
// first layers, shared experts of the routed experts' width, group-limited sigmoid routing.
void write_deepseek_v3_fields(const config::Recipe& recipe, Json& j) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  const config::MlaConfig& mla = model.mla();
  j["n_routed_experts"] = moe.num_experts();
  j["n_shared_experts"] = moe.num_shared_experts() * moe.shared_expert_ffn_hidden_size() /
                          moe.expert_ffn_hidden_size();
  j["moe_intermediate_size"] = moe.expert_ffn_hidden_size();
  j["first_k_dense_replace"] = model.first_dense_layers();
  j["n_group"] = std::max(1, moe.num_groups());
  j["topk_group"] = moe.top_groups() > 0 ? moe.top_groups() : std::max(1, moe.num_groups());
  j["routed_scaling_factor"] =
      json_float(moe.routed_scaling_factor() > 0 ? moe.routed_scaling_factor() : 1.0f);
  j["norm_topk_prob"] = config::effective_renormalize(moe);
  j["q_lora_rank"] = mla.q_lora_rank() > 0 ? Json(mla.q_lora_rank()) : Json(nullptr);
  j["kv_lora_rank"] = mla.kv_lora_rank();
  j["qk_nope_head_dim"] = mla.qk_nope_head_dim();
  j["qk_rope_head_dim"] = mla.qk_rope_head_dim();
  j["v_head_dim"] = mla.v_head_dim();
  j["rope_interleave"] = true;
  j["attention_bias"] = false;
  j["num_nextn_predict_layers"] = model.mtp_depth();
}

// The fields only `architecture`'s config has.
void write_family_fields(const config::Recipe& recipe, const std::string& architecture,
                         const std::map<std::string, Tensor>& weights, Json& j) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  if (architecture == kDeepseekV3) {
    write_deepseek_v3_fields(recipe, j);
    return;
  }
  if (architecture == kMixtral) {
    j["num_local_experts"] = moe.num_experts();
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
    return;
  }
  j["num_experts"] = moe.num_experts();
  j["norm_topk_prob"] = config::effective_renormalize(moe);
  if (architecture == kOlmoe) {
    j["attention_bias"] = false;
    j["clip_qkv"] = nullptr;
    return;
  }
  j["moe_intermediate_size"] = moe.expert_ffn_hidden_size();
  write_layer_pattern(model, j);
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = model.num_layers();
  if (architecture == kQwen3Moe) {
    j["head_dim"] = config::effective_head_dim(model);
    j["attention_bias"] = false;
    return;
  }
  // Several engine shared experts run as one FFN of their summed width.
  int64_t shared_size = 0;
  for (const auto& [name, tensor] : weights) {
    if (name.ends_with(".mlp.shared_expert.gate_up_proj.weight")) shared_size = tensor.shape()[1];
  }
  j["shared_expert_intermediate_size"] = shared_size;
  j["qkv_bias"] = true;
}

std::string model_type_of(const std::string& architecture) {
  if (architecture == kMixtral) return "mixtral";
  if (architecture == kQwen2Moe) return "qwen2_moe";
  if (architecture == kQwen3Moe) return "qwen3_moe";
  if (architecture == kDeepseekV3) return "deepseek_v3";
  return "olmoe";
}

// transformers' rope_scaling: null for plain RoPE, else YaRN's fields.
Json rope_scaling_json(const config::RopeScaling& scaling) {
  if (scaling.type() != config::YARN) return nullptr;
  return {{"rope_type", "yarn"},
          {"factor", json_float(scaling.factor())},
          {"original_max_position_embeddings", scaling.original_max_position_embeddings()},
          {"beta_fast", json_float(scaling.beta_fast())},
          {"beta_slow", json_float(scaling.beta_slow())},
          {"mscale", json_float(scaling.mscale())},
          {"mscale_all_dim", json_float(scaling.mscale_all_dim())}};
}

Json config_json(const config::Recipe& recipe, const std::string& architecture,
                 const std::map<std::string, Tensor>& weights, DType dtype) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  // Mixtral and OLMoE have only MoE layers: their intermediate_size is the experts'.
  // DeepSeek-V3's latent attention reads num_key_value_heads only as num_attention_heads.
  const bool all_moe = architecture == kMixtral || architecture == kOlmoe;
  Json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type_of(architecture);
  j["vocab_size"] = model.vocab_size();
  j["hidden_size"] = model.hidden_size();
  j["intermediate_size"] = all_moe || model.ffn_hidden_size() == 0 ? moe.expert_ffn_hidden_size()
                                                                   : model.ffn_hidden_size();
  j["num_hidden_layers"] = model.num_layers();
  j["num_attention_heads"] = model.num_heads();
  j["num_key_value_heads"] = config::effective_kv_heads(model);
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = model.max_position_embeddings();
  j["initializer_range"] = json_float(model.init_std());
  j["rms_norm_eps"] = json_float(model.norm_eps());
  j["rope_theta"] = json_float(model.rope_theta());
  j["rope_scaling"] = rope_scaling_json(model.rope_scaling());
  j["attention_dropout"] = 0.0;
  j["num_experts_per_tok"] = moe.top_k();
  j["router_aux_loss_coef"] = json_float(moe.aux_loss_coef());
  j["output_router_logits"] = false;
  write_family_fields(recipe, architecture, weights, j);
  j["tie_word_embeddings"] = model.tie_embeddings();
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  j["pad_token_id"] = 3;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);
  return j;
}

// Takes a registry tensor out of those left to export.
using TakeTensor = std::function<absl::StatusOr<Tensor>(const std::string&)>;

// One layer's latent attention (names shared with transformers), its rotary rows
// interleaved as DeepSeek-V3 checkpoints hold them (rope_interleave).
absl::Status rename_latent_attention(const config::ModelConfig& model, const std::string& attn,
                                     const TakeTensor& take, NamedTensors& out) {
  const config::MlaConfig& mla = model.mla();
  const int64_t nope = mla.qk_nope_head_dim(), rope = mla.qk_rope_head_dim(),
                kv_rank = mla.kv_lora_rank();
  auto move = [&](const std::string& name) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor t, take(attn + name));
    out.emplace_back(attn + name, t);
    return absl::OkStatus();
  };
  auto rotary = [&](const std::string& name, int64_t block, int64_t offset) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor t, take(attn + name));
    out.emplace_back(attn + name, reorder_rope_rows(t, block, offset, rope, true));
    return absl::OkStatus();
  };
  if (mla.q_lora_rank() > 0) {
    SY_RETURN_IF_ERROR(move("q_a_proj.weight"));
    SY_RETURN_IF_ERROR(move("q_a_layernorm.weight"));
    SY_RETURN_IF_ERROR(rotary("q_b_proj.weight", nope + rope, nope));
  } else {
    SY_RETURN_IF_ERROR(rotary("q_proj.weight", nope + rope, nope));
  }
  SY_RETURN_IF_ERROR(rotary("kv_a_proj_with_mqa.weight", kv_rank + rope, kv_rank));
  for (const char* name : {"kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"})
    SY_RETURN_IF_ERROR(move(name));
  return absl::OkStatus();
}

// One layer's grouped-query attention, its biases and q/k norms (names shared with
// transformers).
absl::Status rename_attention(const config::ModelConfig& model, const std::string& attn,
                              const TakeTensor& take, NamedTensors& out) {
  std::vector<std::string> names;
  for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    names.push_back(absl::StrCat(proj, ".weight"));
    if (model.attention_bias() && std::string(proj) != "o_proj")
      names.push_back(absl::StrCat(proj, ".bias"));
  }
  if (model.qk_norm() || model.qk_head_norm()) {
    names.push_back("q_norm.weight");
    names.push_back("k_norm.weight");
  }
  for (const std::string& name : names) {
    SY_ASSIGN_OR_RETURN(Tensor t, take(attn + name));
    out.emplace_back(attn + name, t);
  }
  return absl::OkStatus();
}

// Registry names -> transformers names, in the registry file's layer order.
absl::StatusOr<NamedTensors> rename_tensors(const config::Recipe& recipe,
                                            const std::string& architecture,
                                            std::map<std::string, Tensor>& weights,
                                            const std::string& source) {
  const bool mixtral = architecture == kMixtral;
  NamedTensors out;
  auto take = [&](const std::string& name) -> absl::StatusOr<Tensor> {
    auto it = weights.find(name);
    if (it == weights.end()) return absl::DataLossError(absl::StrCat(source, ": missing tensor ", name));
    Tensor t = it->second;
    weights.erase(it);
    return t;
  };
  auto move = [&](const std::string& from, const std::string& to) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor t, take(from));
    out.emplace_back(to, t);
    return absl::OkStatus();
  };
  // A fused (2, ffn, hidden) gate/up parameter becomes two (ffn, hidden) matrices.
  auto split_gate_up = [&](const std::string& from, const std::string& gate,
                           const std::string& up) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor t, take(from));
    const Shape half = {t.shape()[1], t.shape()[2]};
    out.emplace_back(gate, copy_range(t, 0, half));
    out.emplace_back(up, copy_range(t, shape_numel(half), half));
    return absl::OkStatus();
  };

  // Decoder layer `layer`'s tensors (a main layer's, or an MTP module's block).
  auto rename_layer = [&](int layer) -> absl::Status {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    SY_RETURN_IF_ERROR(move(p + "input_layernorm.weight", p + "input_layernorm.weight"));
    if (recipe.model().mla().kv_lora_rank() > 0)
      SY_RETURN_IF_ERROR(rename_latent_attention(recipe.model(), p + "self_attn.", take, out));
    else
      SY_RETURN_IF_ERROR(rename_attention(recipe.model(), p + "self_attn.", take, out));
    SY_RETURN_IF_ERROR(
        move(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight"));
    if (!config::is_moe_layer(recipe, layer)) {
      SY_RETURN_IF_ERROR(split_gate_up(p + "mlp.gate_up_proj.weight", p + "mlp.gate_proj.weight",
                                       p + "mlp.up_proj.weight"));
      SY_RETURN_IF_ERROR(move(p + "mlp.down_proj.weight", p + "mlp.down_proj.weight"));
      return absl::OkStatus();
    }
    const std::string moe = mixtral ? p + "block_sparse_moe." : p + "mlp.";
    SY_RETURN_IF_ERROR(move(p + "mlp.gate.weight", moe + "gate.weight"));
    if (recipe.moe().score_function() == config::SIGMOID)
      SY_RETURN_IF_ERROR(
          move(p + "mlp.gate.e_score_correction_bias", moe + "gate.e_score_correction_bias"));
    SY_ASSIGN_OR_RETURN(Tensor gate_up, take(p + "mlp.experts.gate_up_proj"));
    SY_ASSIGN_OR_RETURN(Tensor down, take(p + "mlp.experts.down_proj"));
    const int64_t experts = gate_up.shape()[0], ffn = gate_up.shape()[1] / 2,
                  hidden = gate_up.shape()[2];
    for (int64_t e = 0; e < experts; ++e) {
      const std::string ep = absl::StrCat(moe, "experts.", e, ".");
      const int64_t base = e * 2 * ffn * hidden;
      out.emplace_back(ep + (mixtral ? "w1.weight" : "gate_proj.weight"),
                       copy_range(gate_up, base, {ffn, hidden}));
      out.emplace_back(ep + (mixtral ? "w3.weight" : "up_proj.weight"),
                       copy_range(gate_up, base + ffn * hidden, {ffn, hidden}));
      out.emplace_back(ep + (mixtral ? "w2.weight" : "down_proj.weight"),
                       copy_range(down, e * hidden * ffn, {hidden, ffn}));
    }
    if (recipe.moe().num_shared_experts() > 0) {
      const std::string shared =
          p + (architecture == kDeepseekV3 ? "mlp.shared_experts." : "mlp.shared_expert.");
      SY_RETURN_IF_ERROR(split_gate_up(p + "mlp.shared_expert.gate_up_proj.weight",
                                       shared + "gate_proj.weight", shared + "up_proj.weight"));
      SY_RETURN_IF_ERROR(move(p + "mlp.shared_expert.down_proj.weight", shared + "down_proj.weight"));
      if (recipe.moe().shared_expert_gate())
        SY_RETURN_IF_ERROR(
            move(p + "mlp.shared_expert_gate.weight", p + "mlp.shared_expert_gate.weight"));
    }
    return absl::OkStatus();
  };
  // The modules' copies of the shared embedding and head, as DeepSeek-V3's checkpoints
  // store them.
  const auto embedding = weights.find("model.embed_tokens.weight");
  const auto head = weights.find(recipe.model().tie_embeddings() ? "model.embed_tokens.weight"
                                                                 : "lm_head.weight");
  const Tensor shared_embedding = embedding != weights.end() ? embedding->second : Tensor();
  const Tensor shared_head = head != weights.end() ? head->second : Tensor();
  SY_RETURN_IF_ERROR(move("model.embed_tokens.weight", "model.embed_tokens.weight"));
  for (int layer = 0; layer < recipe.model().num_layers(); ++layer)
    SY_RETURN_IF_ERROR(rename_layer(layer));
  SY_RETURN_IF_ERROR(move("model.norm.weight", "model.norm.weight"));
  if (!recipe.model().tie_embeddings()) SY_RETURN_IF_ERROR(move("lm_head.weight", "lm_head.weight"));
  for (int k = 1; k <= recipe.model().mtp_depth(); ++k) {
    const int layer = recipe.model().num_layers() + k - 1;
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    if (architecture != kDeepseekV3) {
      // No place for the module in the family's checkpoints (hf_mtp_modules_exported).
      std::erase_if(weights, [&](const auto& w) { return w.first.starts_with(p); });
      continue;
    }
    SY_RETURN_IF_ERROR(rename_layer(layer));
    for (const char* norm : {"enorm.weight", "hnorm.weight", "eh_proj.weight",
                             "shared_head.norm.weight"})
      SY_RETURN_IF_ERROR(move(p + norm, p + norm));
    out.emplace_back(p + "embed_tokens.weight", shared_embedding);
    out.emplace_back(p + "shared_head.head.weight", shared_head);
  }
  if (!weights.empty())
    return absl::DataLossError(absl::StrCat(source, ": unexpected tensor ", weights.begin()->first,
                                            " for this recipe"));
  return out;
}

absl::Status write_weights(const std::string& out_dir, const NamedTensors& tensors,
                           const HfExportOptions& options) {
  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& [name, f32] : tensors) {
    Tensor t = cast(f32, options.dtype);
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) return write_safetensors(out_dir + "/model.safetensors", shards[0]);
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    SY_RETURN_IF_ERROR(write_safetensors(out_dir + "/" + file, shards[i]));
    for (const auto& entry : shards[i]) weight_map[entry.first] = file;
  }
  Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return write_json(out_dir + "/model.safetensors.index.json", index);
}

// The model's tokenizer.model at `path`, or empty when it has none. The exported
// tokenizer files name the engine's special pieces by their ids, and its vocabulary must
// fit the model's.
absl::StatusOr<std::string> export_tokenizer_source(const std::string& path,
                                                    const config::Recipe& recipe) {
  if (path.empty()) return std::string();
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(path));
  SY_RETURN_IF_ERROR(check_tokenizer_fits(tokenizer, path, recipe));
  if (tokenizer.special_ids() != kTrainedSpecialIds)
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": special ids differ from unk 0, bos 1, eos 2, pad 3, which the exported "
        "tokenizer_config.json and generation_config.json assume"));
  return path;
}

// Our tokenizers add no dummy prefix and no bos: legacy false with add_prefix_space
// false keeps transformers from prepending "▁", and add_bos_token false matches the
// training data, which has no bos.
absl::Status write_tokenizer(const std::string& source, const std::string& out_dir,
                             const config::Recipe& recipe) {
  if (source.empty()) return absl::OkStatus();
  SY_RETURN_IF_ERROR(copy_file_atomically(source, out_dir + "/tokenizer.model"));
  const Json specials = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
                         {"pad_token", "<pad>"}};
  Json config = {{"tokenizer_class", "LlamaTokenizer"},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"add_prefix_space", false},
                 {"legacy", false},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", recipe.model().max_position_embeddings()}};
  config.update(specials);
  SY_RETURN_IF_ERROR(write_json(out_dir + "/tokenizer_config.json", config));
  return write_json(out_dir + "/special_tokens_map.json", specials);
}

// "model-00001-of-00003.safetensors": the shard names write_weights gives.
bool is_shard_name(std::string_view name) {
  // Removes a leading run of digits; false when there is none.
  auto digits = [&name]() {
    const size_t n = name.find_first_not_of("0123456789");
    if (n == 0 || n == std::string_view::npos) return false;
    name.remove_prefix(n);
    return true;
  };
  auto literal = [&name](std::string_view text) {
    if (!name.starts_with(text)) return false;
    name.remove_prefix(text.size());
    return true;
  };
  return literal("model-") && digits() && literal("-of-") && digits() &&
         name == ".safetensors";
}

}  // namespace

bool is_hf_export_file(std::string_view name) {
  if (name.ends_with(".partial")) name.remove_suffix(std::strlen(".partial"));
  static constexpr std::string_view kFiles[] = {
      "config.json",          "generation_config.json", "model.safetensors",
      "model.safetensors.index.json", "tokenizer.model", "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json"};
  return std::find(std::begin(kFiles), std::end(kFiles), name) != std::end(kFiles) ||
         is_shard_name(name);
}

namespace {

absl::Status refuse_export(const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("cannot export to transformers: ", why));
}

// transformers 4.x's Mixtral, Qwen2-MoE and OLMoE derive head_dim from hidden / heads.
absl::Status check_derived_head_dim(const config::ModelConfig& model) {
  if (config::effective_head_dim(model) * model.num_heads() == model.hidden_size())
    return absl::OkStatus();
  return refuse_export(absl::StrCat("model.head_dim (", config::effective_head_dim(model),
                                    ") x model.num_heads must equal model.hidden_size (transformers "
                                    "4.x ignores head_dim)"));
}

absl::Status check_only_moe_layers(const config::Recipe& recipe, const std::string& architecture) {
  for (int layer = 0; layer < recipe.model().num_layers(); ++layer) {
    if (!config::is_moe_layer(recipe, layer))
      return refuse_export(absl::StrCat("layer ", layer, " is dense and ", architecture,
                                        " has only MoE layers"));
  }
  return absl::OkStatus();
}

// Qwen3-MoE: per-head q/k norm, routed experts only, optional dense layers.
absl::StatusOr<std::string> qwen3_moe_architecture(const config::Recipe& recipe) {
  if (recipe.moe().num_shared_experts() > 0)
    return refuse_export("moe.num_shared_experts: Qwen3MoeForCausalLM (model.qk_head_norm) has "
                         "no shared experts");
  if (recipe.model().attention_bias())
    return refuse_export("model.attention_bias: Qwen3MoeForCausalLM (model.qk_head_norm) has no "
                         "q/k/v biases without an output bias");
  return std::string(kQwen3Moe);
}

// OLMoE: q/k norm over the whole projection, every layer MoE, no biases.
absl::StatusOr<std::string> olmoe_architecture(const config::Recipe& recipe) {
  if (recipe.moe().num_shared_experts() > 0)
    return refuse_export("moe.num_shared_experts: OlmoeForCausalLM (model.qk_norm) has no "
                         "shared experts");
  if (recipe.model().attention_bias())
    return refuse_export("model.attention_bias: OlmoeForCausalLM (model.qk_norm) has no q/k/v "
                         "biases without an output bias");
  SY_RETURN_IF_ERROR(check_derived_head_dim(recipe.model()));
  SY_RETURN_IF_ERROR(check_only_moe_layers(recipe, kOlmoe));
  return std::string(kOlmoe);
}

absl::StatusOr<std::string> qwen2_moe_architecture(const config::Recipe& recipe) {
  if (!recipe.moe().shared_expert_gate())
    return refuse_export("Qwen2MoeForCausalLM always gates its shared expert: "
                         "moe.shared_expert_gate must be true");
  if (!recipe.model().attention_bias())
    return refuse_export("Qwen2MoeForCausalLM has q/k/v biases: model.attention_bias must be true");
  SY_RETURN_IF_ERROR(check_derived_head_dim(recipe.model()));
  return std::string(kQwen2Moe);
}

// DeepSeek-V3: latent attention, sigmoid routing, every layer past the dense first ones
// MoE, shared experts (ungated) as whole experts of the routed experts' width.
absl::StatusOr<std::string> deepseek_v3_architecture(const config::Recipe& recipe) {
  const config::MoeConfig& moe = recipe.moe();
  if (moe.gating() != config::TOP_K)
    return refuse_export(absl::StrCat("moe.gating ", config::Gating_Name(moe.gating()),
                                      ": DeepseekV3ForCausalLM (model.mla) routes each token to "
                                      "its top-k experts (TOP_K)"));
  if (moe.score_function() != config::SIGMOID)
    return refuse_export(absl::StrCat("moe.score_function ",
                                      config::ScoreFunction_Name(moe.score_function()),
                                      ": DeepseekV3ForCausalLM (model.mla) routes by sigmoid "
                                      "scores (SIGMOID)"));
  if (recipe.model().moe_layer_interval() != 1)
    return refuse_export("model.moe_layer_interval must be 1: DeepseekV3ForCausalLM (model.mla) "
                         "has MoE layers after its dense first layers");
  if (moe.num_shared_experts() > 0 && moe.shared_expert_gate())
    return refuse_export("moe.shared_expert_gate: DeepseekV3ForCausalLM (model.mla) does not gate "
                         "its shared experts");
  if (moe.num_shared_experts() * moe.shared_expert_ffn_hidden_size() %
          moe.expert_ffn_hidden_size() != 0)
    return refuse_export("moe.shared_expert_ffn_hidden_size x moe.num_shared_experts must be a "
                         "multiple of moe.expert_ffn_hidden_size: DeepseekV3ForCausalLM's shared "
                         "experts are as wide as its routed ones");
  return std::string(kDeepseekV3);
}

absl::StatusOr<std::string> mixtral_architecture(const config::Recipe& recipe) {
  SY_RETURN_IF_ERROR(check_derived_head_dim(recipe.model()));
  SY_RETURN_IF_ERROR(check_only_moe_layers(recipe, "MixtralForCausalLM (no shared experts)"));
  if (recipe.model().attention_bias())
    return refuse_export("model.attention_bias: MixtralForCausalLM (no shared experts) has no biases");
  if (!config::effective_renormalize(recipe.moe()))
    return refuse_export("moe.renormalize false: MixtralForCausalLM (no shared experts) "
                         "renormalises the top-k weights (moe.renormalize true)");
  return std::string(kMixtral);
}

}  // namespace

bool hf_mtp_modules_exported(const std::string& architecture) {
  return architecture == kDeepseekV3;
}

absl::StatusOr<std::string> hf_architecture_for(const config::Recipe& recipe) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  if (model.moe_layer_interval() == 0 || moe.num_experts() == 0)
    return refuse_export("the model has no MoE layers (model.moe_layer_interval 0)");
  if (model.mla().kv_lora_rank() > 0) return deepseek_v3_architecture(recipe);
  if (model.rope_scaling().type() != config::ROPE_SCALING_NONE)
    return refuse_export("model.rope_scaling: only DeepseekV3ForCausalLM (model.mla) is exported "
                         "with YaRN");
  if (moe.gating() != config::TOP_K)
    return refuse_export(absl::StrCat("moe.gating ", config::Gating_Name(moe.gating()),
                                      " exists in no transformers class this exports to (they "
                                      "route each token to its top-k experts: TOP_K)"));
  if (moe.score_function() == config::SIGMOID)
    return refuse_export("moe.score_function SIGMOID: of the transformers classes this exports "
                         "to, only DeepseekV3ForCausalLM (model.mla) routes by sigmoid scores");
  if (model.qk_head_norm()) return qwen3_moe_architecture(recipe);
  if (model.qk_norm()) return olmoe_architecture(recipe);
  if (moe.num_shared_experts() > 0) return qwen2_moe_architecture(recipe);
  return mixtral_architecture(recipe);
}

absl::Status export_hf(const std::string& source, const std::string& tokenizer_path,
                       const config::Recipe& recipe, std::map<std::string, Tensor> weights,
                       const std::string& out_dir, const HfExportOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16)
    return absl::InvalidArgumentError("--dtype must be fp32 or bf16");
  if (options.max_shard_bytes <= 0)
    return absl::InvalidArgumentError("--max-shard-size must be > 0");
  SY_ASSIGN_OR_RETURN(const std::string architecture, hf_architecture_for(recipe));
  SY_ASSIGN_OR_RETURN(const std::string tokenizer, export_tokenizer_source(tokenizer_path, recipe));
  const Json config = config_json(recipe, architecture, weights, options.dtype);
  SY_ASSIGN_OR_RETURN(const NamedTensors tensors,
                      rename_tensors(recipe, architecture, weights, source));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  SY_RETURN_IF_ERROR(write_weights(out_dir, tensors, options));
  SY_RETURN_IF_ERROR(write_json(out_dir + "/config.json", config));
  const Json generation = {{"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 3}};
  SY_RETURN_IF_ERROR(write_json(out_dir + "/generation_config.json", generation));
  return write_tokenizer(tokenizer, out_dir, recipe);
}

}  // namespace switchyard
