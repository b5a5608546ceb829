#include "checkpoint/hf_import.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "engine/config/recipe.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

enum class Family { kMixtral, kQwen2Moe, kOlmoe };

absl::StatusOr<Json> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

bool present(const Json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// Reads the config fields the engine maps, refusing the ones it cannot honour. Every
// error names config.json and the field.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {}

  absl::StatusOr<int64_t> integer(const char* key) const {
    if (!present(j_, key) || !j_[key].is_number_integer())
      return absl::InvalidArgumentError(absl::StrCat(path_, ": field ", key, " must be an integer"));
    return j_[key].get<int64_t>();
  }
  absl::StatusOr<int64_t> integer(const char* key, int64_t fallback) const {
    return present(j_, key) ? integer(key) : fallback;
  }
  absl::StatusOr<double> number(const char* key, double fallback) const {
    if (!present(j_, key)) return fallback;
    if (!j_[key].is_number())
      return absl::InvalidArgumentError(absl::StrCat(path_, ": field ", key, " must be a number"));
    return j_[key].get<double>();
  }
  absl::StatusOr<bool> boolean(const char* key, bool fallback) const {
    if (!present(j_, key)) return fallback;
    if (!j_[key].is_boolean())
      return absl::InvalidArgumentError(absl::StrCat(path_, ": field ", key, " must be true or false"));
    return j_[key].get<bool>();
  }
  absl::Status refuse(const std::string& key, const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat(path_, ": ", key, " ", why));
  }
  const Json& json() const { return j_; }

 private:
  const Json& j_;
  std::string path_;
};

absl::StatusOr<Family> family_of(const Json& j, const std::string& path) {
  const std::string type = j.value("model_type", "");
  if (type == "mixtral") return Family::kMixtral;
  if (type == "qwen2_moe") return Family::kQwen2Moe;
  if (type == "olmoe") return Family::kOlmoe;
  return absl::UnimplementedError(absl::StrCat(
      path, ": model_type \"", type, "\" is not one of mixtral, qwen2_moe, olmoe"));
}

// RoPE base from the 4.x top-level field or 5.x rope_parameters; only plain RoPE.
absl::StatusOr<double> rope_theta(const ConfigReader& c) {
  const Json& j = c.json();
  if (present(j, "rope_scaling")) return c.refuse("rope_scaling", "is set: the engine has plain RoPE only");
  if (present(j, "rope_parameters")) {
    const Json& rope = j["rope_parameters"];
    const std::string type = rope.value("rope_type", "default");
    if (type != "default")
      return c.refuse("rope_parameters.rope_type", absl::StrCat("\"", type, "\": the engine has plain RoPE only"));
    if (rope.contains("rope_theta") && rope["rope_theta"].is_number()) return rope["rope_theta"].get<double>();
  }
  return c.number("rope_theta", 10000.0);
}

absl::StatusOr<config::Recipe> recipe_from_config(const Json& j, Family family,
                                                  const std::string& path, const std::string& name) {
  const ConfigReader c(j, path);
  config::Recipe recipe;
  recipe.set_name(name);
  config::ModelConfig& model = *recipe.mutable_model();
  config::MoeConfig& moe = *recipe.mutable_moe();

  const std::string act = j.value("hidden_act", "silu");
  if (act != "silu") return c.refuse("hidden_act", absl::StrCat("\"", act, "\": the engine's FFNs are SwiGLU (silu)"));
  SY_ASSIGN_OR_RETURN(const bool mlp_bias, c.boolean("mlp_bias", false));
  if (mlp_bias) return c.refuse("mlp_bias", "is true: the engine's FFNs have no biases");

  SY_ASSIGN_OR_RETURN(const int64_t vocab, c.integer("vocab_size"));
  SY_ASSIGN_OR_RETURN(const int64_t hidden, c.integer("hidden_size"));
  SY_ASSIGN_OR_RETURN(const int64_t layers, c.integer("num_hidden_layers"));
  SY_ASSIGN_OR_RETURN(const int64_t heads, c.integer("num_attention_heads"));
  SY_ASSIGN_OR_RETURN(const int64_t kv_heads, c.integer("num_key_value_heads", heads));
  SY_ASSIGN_OR_RETURN(const int64_t head_dim, c.integer("head_dim", 0));
  SY_ASSIGN_OR_RETURN(const int64_t max_positions, c.integer("max_position_embeddings"));
  SY_ASSIGN_OR_RETURN(const double theta, rope_theta(c));
  SY_ASSIGN_OR_RETURN(const double eps, c.number("rms_norm_eps", 1e-6));
  SY_ASSIGN_OR_RETURN(const double init_std, c.number("initializer_range", 0.02));
  SY_ASSIGN_OR_RETURN(const bool tie, c.boolean("tie_word_embeddings", false));
  SY_ASSIGN_OR_RETURN(const int64_t experts,
                      c.integer(family == Family::kMixtral ? "num_local_experts" : "num_experts"));
  SY_ASSIGN_OR_RETURN(const int64_t top_k, c.integer("num_experts_per_tok"));
  SY_ASSIGN_OR_RETURN(const double aux_coef, c.number("router_aux_loss_coef", 0.0));
  model.set_vocab_size(vocab);
  model.set_hidden_size(hidden);
  model.set_num_layers(static_cast<int32_t>(layers));
  model.set_num_heads(static_cast<int32_t>(heads));
  model.set_num_kv_heads(static_cast<int32_t>(kv_heads));
  model.set_head_dim(static_cast<int32_t>(head_dim));
  model.set_rope_theta(static_cast<float>(theta));
  model.set_norm_eps(static_cast<float>(eps));
  model.set_init_std(static_cast<float>(init_std));
  model.set_tie_embeddings(tie);
  model.set_max_position_embeddings(max_positions);
  moe.set_num_experts(static_cast<int32_t>(experts));
  moe.set_top_k(static_cast<int32_t>(top_k));
  moe.set_aux_loss_coef(static_cast<float>(aux_coef));

  switch (family) {
    case Family::kMixtral: {
      if (present(j, "sliding_window")) return c.refuse("sliding_window", "is set: the engine attends to the whole window");
      SY_ASSIGN_OR_RETURN(const double jitter, c.number("router_jitter_noise", 0.0));
      if (jitter != 0) return c.refuse("router_jitter_noise", "is not 0: the engine has no router jitter");
      SY_ASSIGN_OR_RETURN(const int64_t ffn, c.integer("intermediate_size"));
      moe.set_expert_ffn_hidden_size(ffn);
      moe.set_gating(config::TOPK_SOFTMAX);
      model.set_moe_layer_interval(1);
      break;
    }
    case Family::kQwen2Moe: {
      SY_ASSIGN_OR_RETURN(const bool sliding, c.boolean("use_sliding_window", false));
      if (sliding) return c.refuse("use_sliding_window", "is true: the engine attends to the whole window");
      SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("qkv_bias", true));
      SY_ASSIGN_OR_RETURN(const int64_t step, c.integer("decoder_sparse_step", 1));
      SY_ASSIGN_OR_RETURN(const int64_t dense_ffn, c.integer("intermediate_size"));
      SY_ASSIGN_OR_RETURN(const int64_t expert_ffn, c.integer("moe_intermediate_size"));
      SY_ASSIGN_OR_RETURN(const int64_t shared_ffn, c.integer("shared_expert_intermediate_size"));
      SY_ASSIGN_OR_RETURN(const bool norm_topk, c.boolean("norm_topk_prob", false));
      // The engine's dense layers can only be a prefix of the stack (first_dense_layers).
      int64_t first_dense = 0;
      if (present(j, "mlp_only_layers")) {
        const Json& dense = j["mlp_only_layers"];
        for (size_t i = 0; i < dense.size(); ++i) {
          if (!dense[i].is_number_integer() || dense[i].get<int64_t>() != static_cast<int64_t>(i))
            return c.refuse("mlp_only_layers", "must be 0, 1, ... n-1: the engine's dense layers are the first n");
        }
        first_dense = static_cast<int64_t>(dense.size());
      }
      model.set_attention_bias(bias);
      model.set_ffn_hidden_size(dense_ffn);
      model.set_moe_layer_interval(static_cast<int32_t>(step));
      model.set_first_dense_layers(static_cast<int32_t>(first_dense));
      moe.set_expert_ffn_hidden_size(expert_ffn);
      if (shared_ffn > 0) {
        moe.set_num_shared_experts(1);
        moe.set_shared_expert_ffn_hidden_size(shared_ffn);
        moe.set_shared_expert_gate(true);
      }
      moe.set_gating(norm_topk ? config::TOPK_SOFTMAX : config::SOFTMAX_TOPK);
      break;
    }
    case Family::kOlmoe: {
      if (present(j, "clip_qkv")) return c.refuse("clip_qkv", "is set: the engine does not clamp q, k and v");
      SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("attention_bias", false));
      if (bias) return c.refuse("attention_bias", "is true: OLMoE's output projection bias has no engine counterpart");
      SY_ASSIGN_OR_RETURN(const int64_t ffn, c.integer("intermediate_size"));
      SY_ASSIGN_OR_RETURN(const bool norm_topk, c.boolean("norm_topk_prob", false));
      model.set_qk_norm(true);
      model.set_moe_layer_interval(1);
      moe.set_expert_ffn_hidden_size(ffn);
      moe.set_gating(norm_topk ? config::TOPK_SOFTMAX : config::SOFTMAX_TOPK);
      break;
    }
  }
  // Training settings are placeholders that make the recipe valid for `sample` and
  // `eval`; fine-tuning sets its own data and schedule with --set.
  recipe.mutable_optimizer()->set_lr(1e-4f);
  recipe.mutable_optimizer()->set_decay(config::CONSTANT);
  recipe.mutable_train()->set_global_batch_size(1);
  recipe.mutable_train()->set_seq_len(max_positions);
  recipe.mutable_data()->set_dataset("unset");
  config::fill_defaults(recipe);
  const absl::Status valid = config::validate_recipe(recipe);
  if (!valid.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": gives an invalid recipe: ", valid.message()));
  return recipe;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // Subnormal: normalise the mantissa.
    exponent = 113;
    while (!(mantissa & 0x400)) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

absl::StatusOr<Tensor> to_f32(const Tensor& t, const std::string& name, const std::string& file) {
  if (t.dtype() == DType::kF32) return t;
  Tensor out = Tensor::empty(t.shape(), DType::kF32);
  float* dst = out.data<float>();
  const uint16_t* src = static_cast<const uint16_t*>(t.raw_data());
  if (t.dtype() == DType::kBF16) {
    const bf16* values = t.data<bf16>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = to_float(values[i]);
  } else if (t.dtype() == DType::kF16) {
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = half_to_float(src[i]);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", name, " is ",
                                                   dtype_name(t.dtype()), ", not F32, BF16 or F16"));
  }
  return out;
}

// Every tensor of the directory in f32, under names with Mixtral's `block_sparse_moe`
// read as `mlp` (transformers 5.x's own spelling).
absl::StatusOr<std::map<std::string, Tensor>> read_hf_tensors(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else if (fs::exists(index_path)) {
    SY_ASSIGN_OR_RETURN(const Json index, read_json(index_path));
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map object"));
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string())
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[", name, "] is not a file name"));
      if (std::find(files.begin(), files.end(), file.get<std::string>()) == files.end())
        files.push_back(file.get<std::string>());
    }
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  std::map<std::string, Tensor> out;
  for (const std::string& file : files) {
    const std::string path = dir + "/" + file;
    SY_ASSIGN_OR_RETURN(auto tensors, read_safetensors(path));
    for (auto& [name, tensor] : tensors) {
      std::string key = name;
      if (const size_t at = key.find(".block_sparse_moe."); at != std::string::npos)
        key.replace(at, std::strlen(".block_sparse_moe."), ".mlp.");
      SY_ASSIGN_OR_RETURN(out[key], to_f32(tensor, name, path));
    }
  }
  return out;
}

// Builds the registry tensors, in registry order, from the transformers tensors.
class TensorMapper {
 public:
  TensorMapper(std::map<std::string, Tensor> tensors, std::string source)
      : tensors_(std::move(tensors)), source_(std::move(source)) {}

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  absl::StatusOr<Tensor> take(const std::string& name, const Shape& shape) {
    auto it = tensors_.find(name);
    if (it == tensors_.end())
      return absl::DataLossError(absl::StrCat(source_, ": missing tensor ", name));
    if (it->second.shape() != shape)
      return absl::DataLossError(absl::StrCat(source_, ": tensor ", name, " has shape ",
                                              shape_string(it->second.shape()), ", expected ",
                                              shape_string(shape)));
    Tensor t = it->second;
    tensors_.erase(it);
    return t;
  }
  absl::Status move(const std::string& from, const std::string& to, const Shape& shape) {
    SY_ASSIGN_OR_RETURN(Tensor t, take(from, shape));
    out_.emplace_back(to, t);
    return absl::OkStatus();
  }
  // Gate and up matrices of `count` FFNs stacked as (count, 2 x ffn, hidden).
  absl::StatusOr<Tensor> fuse(const std::vector<std::pair<std::string, std::string>>& gate_up,
                              int64_t ffn, int64_t hidden) {
    const int64_t n = ffn * hidden, count = static_cast<int64_t>(gate_up.size());
    Tensor fused = Tensor::empty({count, 2 * ffn, hidden}, DType::kF32);
    for (int64_t e = 0; e < count; ++e) {
      SY_ASSIGN_OR_RETURN(Tensor gate, take(gate_up[e].first, {ffn, hidden}));
      SY_ASSIGN_OR_RETURN(Tensor up, take(gate_up[e].second, {ffn, hidden}));
      std::memcpy(fused.data<float>() + 2 * e * n, gate.data<float>(), n * sizeof(float));
      std::memcpy(fused.data<float>() + (2 * e + 1) * n, up.data<float>(), n * sizeof(float));
    }
    return fused;
  }
  void emit(const std::string& name, Tensor t) { out_.emplace_back(name, std::move(t)); }

  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> finish() {
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      // Older checkpoints store the RoPE frequencies, which the engine recomputes.
      it = it->first.ends_with("rotary_emb.inv_freq") ? tensors_.erase(it) : std::next(it);
    }
    if (!tensors_.empty())
      return absl::UnimplementedError(
          absl::StrCat(source_, ": tensor ", tensors_.begin()->first, " has no engine counterpart"));
    return std::move(out_);
  }

 private:
  std::map<std::string, Tensor> tensors_;
  std::string source_;
  std::vector<std::pair<std::string, Tensor>> out_;
};

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> map_tensors(
    const config::Recipe& recipe, Family family, TensorMapper& m) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  const int64_t V = model.vocab_size(), H = model.hidden_size(), hd = config::effective_head_dim(model);
  const int64_t q = model.num_heads() * hd, kv = config::effective_kv_heads(model) * hd;
  const int64_t E = moe.num_experts(), I = moe.expert_ffn_hidden_size();
  const char* gate_name = family == Family::kMixtral ? "w1" : "gate_proj";
  const char* up_name = family == Family::kMixtral ? "w3" : "up_proj";
  const char* down_name = family == Family::kMixtral ? "w2" : "down_proj";

  SY_RETURN_IF_ERROR(m.move("model.embed_tokens.weight", "model.embed_tokens.weight", {V, H}));
  for (int layer = 0; layer < model.num_layers(); ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    const std::string attn = p + "self_attn.";
    SY_RETURN_IF_ERROR(m.move(p + "input_layernorm.weight", p + "input_layernorm.weight", {H}));
    const std::vector<std::pair<std::string, int64_t>> projections = {
        {"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
    for (const auto& [proj, rows] : projections) {
      SY_RETURN_IF_ERROR(m.move(attn + proj + ".weight", attn + proj + ".weight", {rows, H}));
      if (model.attention_bias())
        SY_RETURN_IF_ERROR(m.move(attn + proj + ".bias", attn + proj + ".bias", {rows}));
    }
    SY_RETURN_IF_ERROR(m.move(attn + "o_proj.weight", attn + "o_proj.weight", {H, q}));
    if (model.qk_norm()) {
      SY_RETURN_IF_ERROR(m.move(attn + "q_norm.weight", attn + "q_norm.weight", {q}));
      SY_RETURN_IF_ERROR(m.move(attn + "k_norm.weight", attn + "k_norm.weight", {kv}));
    }
    SY_RETURN_IF_ERROR(
        m.move(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight", {H}));
    const std::string mlp = p + "mlp.";
    if (!config::is_moe_layer(recipe, layer)) {
      const int64_t F = model.ffn_hidden_size();
      SY_ASSIGN_OR_RETURN(Tensor fused,
                          m.fuse({{mlp + "gate_proj.weight", mlp + "up_proj.weight"}}, F, H));
      m.emit(mlp + "gate_up_proj.weight", fused.reshape({2, F, H}));
      SY_RETURN_IF_ERROR(m.move(mlp + "down_proj.weight", mlp + "down_proj.weight", {H, F}));
      continue;
    }
    SY_RETURN_IF_ERROR(m.move(mlp + "gate.weight", mlp + "gate.weight", {E, H}));
    const std::string experts = mlp + "experts.";
    if (m.has(experts + "gate_up_proj")) {
      // transformers 5.x fused layout: already the registry's.
      SY_RETURN_IF_ERROR(m.move(experts + "gate_up_proj", experts + "gate_up_proj", {E, 2 * I, H}));
      SY_RETURN_IF_ERROR(m.move(experts + "down_proj", experts + "down_proj", {E, H, I}));
    } else {
      std::vector<std::pair<std::string, std::string>> gate_up;
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = absl::StrCat(experts, e, ".");
        gate_up.emplace_back(absl::StrCat(ep, gate_name, ".weight"), absl::StrCat(ep, up_name, ".weight"));
      }
      SY_ASSIGN_OR_RETURN(Tensor fused, m.fuse(gate_up, I, H));
      m.emit(experts + "gate_up_proj", fused);
      Tensor down = Tensor::empty({E, H, I}, DType::kF32);
      for (int64_t e = 0; e < E; ++e) {
        SY_ASSIGN_OR_RETURN(Tensor t, m.take(absl::StrCat(experts, e, ".", down_name, ".weight"), {H, I}));
        std::memcpy(down.data<float>() + e * H * I, t.data<float>(), t.nbytes());
      }
      m.emit(experts + "down_proj", down);
    }
    if (moe.num_shared_experts() > 0) {
      const int64_t S = moe.shared_expert_ffn_hidden_size();
      const std::string shared = mlp + "shared_expert.";
      SY_ASSIGN_OR_RETURN(Tensor fused,
                          m.fuse({{shared + "gate_proj.weight", shared + "up_proj.weight"}}, S, H));
      m.emit(shared + "gate_up_proj.weight", fused.reshape({2, S, H}));
      SY_RETURN_IF_ERROR(m.move(shared + "down_proj.weight", shared + "down_proj.weight", {H, S}));
      SY_RETURN_IF_ERROR(m.move(mlp + "shared_expert_gate.weight", mlp + "shared_expert_gate.weight", {1, H}));
    }
  }
  SY_RETURN_IF_ERROR(m.move("model.norm.weight", "model.norm.weight", {H}));
  if (!model.tie_embeddings()) {
    SY_RETURN_IF_ERROR(m.move("lm_head.weight", "lm_head.weight", {V, H}));
  } else if (m.has("lm_head.weight")) {
    // A tied model may still store its (identical) output matrix.
    SY_RETURN_IF_ERROR(m.take("lm_head.weight", {V, H}).status());
  }
  return m.finish();
}

}  // namespace

absl::Status import_hf(const std::string& hf_dir, const std::string& out_dir) {
  const std::string config_path = hf_dir + "/config.json";
  SY_ASSIGN_OR_RETURN(const Json j, read_json(config_path));
  SY_ASSIGN_OR_RETURN(const Family family, family_of(j, config_path));
  fs::path dir = fs::path(hf_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  SY_ASSIGN_OR_RETURN(const config::Recipe recipe,
                      recipe_from_config(j, family, config_path, dir.filename().string()));
  SY_ASSIGN_OR_RETURN(auto hf_tensors, read_hf_tensors(hf_dir));
  TensorMapper mapper(std::move(hf_tensors), hf_dir);
  SY_ASSIGN_OR_RETURN(const auto tensors, map_tensors(recipe, family, mapper));

  const std::string tokenizer = hf_dir + "/tokenizer.model";
  return save_weights(out_dir, recipe, tensors, fs::exists(tokenizer) ? tokenizer : "");
}

}  // namespace switchyard
