#include "checkpoint/hf_import.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <filesystem>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"
#include "data/tokenizer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

enum class Family { kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe, kDeepseekV3, kLlama, kMistral, kQwen2 };

// The dense families, read only to be upcycled (checkpoint/upcycle.h).
bool is_dense(Family family) {
  return family == Family::kLlama || family == Family::kMistral || family == Family::kQwen2;
}

// The widest value a config.json integer may have: the recipe stores most of them as
// int32, and validate_recipe applies the engine's own limits after.
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr double kMaxFloat = std::numeric_limits<float>::max();

absl::Status refuse(const std::string& path, const std::string& key, const std::string& why) {
  return absl::UnimplementedError(absl::StrCat(path, ": ", key, " ", why));
}

// A number above 0 and at most `hi`.
absl::StatusOr<double> positive_number(const JsonFields& f, const char* key, double hi) {
  const nlohmann::json* v = f.find(key);
  if (!v || !v->is_number() || !(v->get<double>() > 0) || !(v->get<double>() <= hi))
    return f.error(key, absl::StrCat("must be a finite number in (0, ", hi, "]"));
  return v->get<double>();
}

// transformers' model_type of each family (config.json's).
const char* model_type_name(Family family) {
  switch (family) {
    case Family::kMixtral: return "mixtral";
    case Family::kQwen2Moe: return "qwen2_moe";
    case Family::kQwen3Moe: return "qwen3_moe";
    case Family::kOlmoe: return "olmoe";
    case Family::kDeepseekV3: return "deepseek_v3";
    case Family::kLlama: return "llama";
    case Family::kMistral: return "mistral";
    case Family::kQwen2: return "qwen2";
  }
  return "";
}

absl::StatusOr<Family> family_of(const JsonFields& c) {
  SY_ASSIGN_OR_RETURN(const std::string type, c.string("model_type"));
  for (const Family family : {Family::kMixtral, Family::kQwen2Moe, Family::kQwen3Moe,
                              Family::kOlmoe, Family::kDeepseekV3, Family::kLlama,
                              Family::kMistral, Family::kQwen2})
    if (type == model_type_name(family)) return family;
  return absl::UnimplementedError(
      absl::StrCat(c.path(), ": model_type \"", type.substr(0, 64),
                   "\" is not one of mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, llama, "
                   "mistral, qwen2"));
}

// transformers 5.24's default for each field its config class for the family declares
// (MixtralConfig() and so on; rope_theta is the class's default_theta), "every" holding
// those all eight share unless they say otherwise: what transformers reads for a field
// config.json leaves out. A field whose default is None (head_dim,
// Mixtral's sliding_window, OLMoE's and Llama's num_key_value_heads) is not listed: its
// reader says what its absence means. DeepSeek-V3's router_aux_loss_coef is not a
// transformers field: the model trains without the auxiliary loss.
const Json& transformers_defaults(Family family) {
  static const Json* defaults = [] {
    Json all = Json::parse(R"({
  "every": {"initializer_range": 0.02, "tie_word_embeddings": false, "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0},
  "mixtral": {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "intermediate_size": 14336, "num_local_experts": 8,
    "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "rope_theta": 1000000.0},
  "qwen2_moe": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 32768,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "qkv_bias": true,
    "router_aux_loss_coef": 0.001, "decoder_sparse_step": 1, "norm_topk_prob": false,
    "use_sliding_window": false},
  "qwen3_moe": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_local_experts": 128, "num_experts_per_tok": 8, "attention_bias": false,
    "router_aux_loss_coef": 0.001, "decoder_sparse_step": 1, "norm_topk_prob": false,
    "use_sliding_window": false},
  "olmoe": {"vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
    "intermediate_size": 2048, "num_experts": 64, "num_experts_per_tok": 8,
    "router_aux_loss_coef": 0.01, "norm_topk_prob": false, "attention_bias": false},
  "deepseek_v3": {"vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "norm_topk_prob": true, "attention_bias": false,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "first_k_dense_replace": 3,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
    "rope_interleave": true, "router_aux_loss_coef": 0.0},
  "llama": {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "mlp_bias": false,
    "intermediate_size": 11008, "attention_bias": false},
  "mistral": {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "intermediate_size": 14336, "sliding_window": 4096},
  "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
    "intermediate_size": 22016, "use_sliding_window": false}
})");
    auto* by_type = new Json(Json::object());
    for (const auto& [type, fields] : all.items()) {
      if (type == "every") continue;
      Json merged = all["every"];
      merged.update(fields);
      (*by_type)[type] = std::move(merged);
    }
    return by_type;
  }();
  return defaults->at(model_type_name(family));
}

// config.json's fields, read as transformers reads them: a field the file leaves out
// takes transformers' default for the family (its errors say so), a field the file sets
// must have the type and range the engine needs, and null is a wrong type except where a
// reader says what it means. An explicit 0 is never read as "the default".
class HfFields {
 public:
  HfFields(const JsonFields& file, Family family)
      : file_(file), family_(family) {}

  Family family() const { return family_; }
  const JsonFields& file() const { return file_; }
  const std::string& path() const { return file_.path(); }
  // Present in the file, null included.
  bool written(const char* key) const { return file_.json().contains(key); }
  // Present in the file and not null.
  bool has(const char* key) const { return file_.has(key); }
  // Present in the file as null.
  bool is_null(const char* key) const { return written(key) && !has(key); }
  absl::Status error(const std::string& key, const std::string& why) const {
    return file_.error(key, why);
  }

  absl::StatusOr<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    if (written(key)) return file_.integer(key, lo, hi);
    return default_of(key).integer(key, lo, hi);
  }
  // A float of the recipe: finite, within float's range and above 0.
  absl::StatusOr<float> positive(const char* key) const {
    SY_ASSIGN_OR_RETURN(const double value,
                        positive_number(written(key) ? file_ : default_of(key), key, kMaxFloat));
    return static_cast<float>(value);
  }
  // A float of the recipe that may be 0: finite and in [0, float's range].
  absl::StatusOr<float> non_negative(const char* key) const {
    SY_ASSIGN_OR_RETURN(const double value,
                        (written(key) ? file_ : default_of(key)).number(key, 0, kMaxFloat));
    return static_cast<float>(value);
  }
  absl::StatusOr<bool> boolean(const char* key) const {
    return written(key) ? file_.boolean(key) : default_of(key).boolean(key);
  }
  absl::StatusOr<std::string> string(const char* key) const {
    return written(key) ? file_.string(key) : default_of(key).string(key);
  }
  // A field that, when the file or transformers' default sets it, names a feature the
  // engine lacks: the refusal says which of them set it.
  absl::Status refuse_set(const char* key, const std::string& why) const {
    if (written(key)) return absl::UnimplementedError(absl::StrCat(path(), ": ", key, " is set: ", why));
    return absl::UnimplementedError(
        absl::StrCat(path(), ": ", key, " is absent, which transformers reads as ",
                     transformers_defaults(family_).at(key).dump(), ": ", why));
  }
  // Whether the file or transformers' default gives `key` a non-null value.
  bool set(const char* key) const {
    return written(key) ? has(key) : transformers_defaults(family_).contains(key);
  }

 private:
  // A reader of transformers' default for `key`, its errors naming the file and saying
  // that the value is the default.
  JsonFields default_of(const char* key) const {
    const Json& defaults = transformers_defaults(family_);
    JsonFields reader(defaults, file_.path());
    reader.note(key, defaults.contains(key)
                         ? absl::StrCat("absent: transformers' default ", defaults.at(key).dump())
                         : "absent, and transformers has no default");
    return reader;
  }

  const JsonFields& file_;
  Family family_;
};

// YaRN's fields of a rope_scaling or rope_parameters object (model.rope_scaling): factor
// is required; the original context defaults to max_position_embeddings, as transformers
// 4.x has it; beta_fast and beta_slow to 32 and 1 and mscale and mscale_all_dim to none,
// as transformers' YaRN reads them, and each, when set, must be above 0.
absl::Status read_yarn(const JsonFields& rope, const std::string& key, config::ModelConfig& model) {
  constexpr double kMaxFactor = 65536;  // validate_recipe's bound on every factor
  if (rope.has("attention_factor"))
    return refuse(rope.path(), key + ".attention_factor", "is set: the engine derives YaRN's attention factor "
                                                   "from factor, mscale and mscale_all_dim");
  SY_ASSIGN_OR_RETURN(const bool truncate, rope.boolean_or("truncate", true));
  if (!truncate) return refuse(rope.path(), key + ".truncate", "is false: the engine rounds YaRN's ramp ends");
  if (!rope.has("factor")) return rope.error("factor", "must be set for YaRN");
  SY_ASSIGN_OR_RETURN(const double factor, rope.number("factor", 0, kMaxFactor));
  SY_ASSIGN_OR_RETURN(const int64_t original,
                      rope.integer_or("original_max_position_embeddings",
                                      model.max_position_embeddings(), 1, kMaxInt32));
  auto positive_or = [&](const char* field, double absent) -> absl::StatusOr<double> {
    return rope.has(field) ? positive_number(rope, field, kMaxFactor) : absent;
  };
  SY_ASSIGN_OR_RETURN(const double beta_fast, positive_or("beta_fast", 32));
  SY_ASSIGN_OR_RETURN(const double beta_slow, positive_or("beta_slow", 1));
  // 0 is the recipe's "no mscale" (config::RopeScaling).
  SY_ASSIGN_OR_RETURN(const double mscale, positive_or("mscale", 0));
  SY_ASSIGN_OR_RETURN(const double mscale_all_dim, positive_or("mscale_all_dim", 0));
  config::RopeScaling& scaling = *model.mutable_rope_scaling();
  scaling.set_type(config::YARN);
  scaling.set_factor(static_cast<float>(factor));
  scaling.set_original_max_position_embeddings(original);
  scaling.set_beta_fast(static_cast<float>(beta_fast));
  scaling.set_beta_slow(static_cast<float>(beta_slow));
  scaling.set_mscale(static_cast<float>(mscale));
  scaling.set_mscale_all_dim(static_cast<float>(mscale_all_dim));
  return absl::OkStatus();
}

// RoPE from the 4.x top-level rope_theta and rope_scaling or 5.x rope_parameters: plain
// RoPE, or YaRN for DeepSeek-V3. Reads max_position_embeddings first.
absl::Status read_rope(const HfFields& c, config::ModelConfig& model) {
  SY_ASSIGN_OR_RETURN(const float theta, c.positive("rope_theta"));
  model.set_rope_theta(theta);
  const char* key = c.has("rope_scaling") ? "rope_scaling"
                    : c.has("rope_parameters") ? "rope_parameters"
                                                : nullptr;
  if (!key) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(const JsonFields rope, c.file().object(key));
  if (rope.has("rope_theta")) {
    SY_ASSIGN_OR_RETURN(const double rope_theta, positive_number(rope, "rope_theta", kMaxFloat));
    model.set_rope_theta(static_cast<float>(rope_theta));
  }
  SY_ASSIGN_OR_RETURN(const std::string legacy_type, rope.string_or("type", "default"));
  SY_ASSIGN_OR_RETURN(const std::string type, rope.string_or("rope_type", legacy_type));
  if (type == "default") return absl::OkStatus();
  if (type == "yarn" && c.family() == Family::kDeepseekV3) return read_yarn(rope, key, model);
  return refuse(c.path(), absl::StrCat(key, ".rope_type"),
                absl::StrCat("\"", type.substr(0, 64), "\": the engine has plain RoPE, and YaRN "
                             "for DeepSeek-V3"));
}

// The engine's dense layers can only be a prefix of the stack (first_dense_layers);
// mlp_only_layers null is none, as transformers reads it.
absl::StatusOr<int64_t> first_dense_layers(const HfFields& c, int64_t layers) {
  const Json* dense = c.file().find("mlp_only_layers");
  if (!dense) return 0;
  if (!dense->is_array() || static_cast<int64_t>(dense->size()) > layers)
    return c.error("mlp_only_layers", "must be an array of at most num_hidden_layers layers");
  for (size_t i = 0; i < dense->size(); ++i) {
    const Json& layer = (*dense)[i];
    if (!layer.is_number_integer() || layer.get<int64_t>() != static_cast<int64_t>(i))
      return refuse(c.path(), "mlp_only_layers", "must be 0, 1, ... n-1: the engine's dense layers are the first n");
  }
  return static_cast<int64_t>(dense->size());
}

// Every family routes each token to its top-k experts by `scores`, the chosen weights
// divided by their sum when `renormalize` (transformers' norm_topk_prob).
void set_routing(config::ScoreFunction scores, bool renormalize, config::MoeConfig& moe) {
  moe.set_gating(config::TOP_K);
  moe.set_score_function(scores);
  moe.set_renormalize(renormalize);
}

absl::Status read_mixtral(const HfFields& c, config::Recipe& recipe) {
  if (c.set("sliding_window")) return c.refuse_set("sliding_window", "the engine attends to the whole window");
  SY_ASSIGN_OR_RETURN(const float jitter, c.non_negative("router_jitter_noise"));
  if (jitter != 0) return refuse(c.path(), "router_jitter_noise", "is not 0: the engine has no router jitter");
  SY_ASSIGN_OR_RETURN(const int64_t ffn, c.integer("intermediate_size", 1, kMaxInt32));
  recipe.mutable_moe()->set_expert_ffn_hidden_size(ffn);
  set_routing(config::SOFTMAX, /*renormalize=*/true, *recipe.mutable_moe());
  recipe.mutable_model()->set_moe_layer_interval(1);
  return absl::OkStatus();
}

// The Qwen families' layers and routed experts: dense layers by mlp_only_layers and
// decoder_sparse_step, their width, the experts' width and norm_topk_prob.
absl::Status read_qwen_layers(const HfFields& c, config::Recipe& recipe) {
  config::ModelConfig& model = *recipe.mutable_model();
  config::MoeConfig& moe = *recipe.mutable_moe();
  SY_ASSIGN_OR_RETURN(const bool sliding, c.boolean("use_sliding_window"));
  if (sliding) return refuse(c.path(), "use_sliding_window", "is true: the engine attends to the whole window");
  SY_ASSIGN_OR_RETURN(const int64_t step, c.integer("decoder_sparse_step", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t dense_ffn, c.integer("intermediate_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t expert_ffn, c.integer("moe_intermediate_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const bool norm_topk, c.boolean("norm_topk_prob"));
  SY_ASSIGN_OR_RETURN(const int64_t first_dense, first_dense_layers(c, model.num_layers()));
  model.set_ffn_hidden_size(dense_ffn);
  model.set_moe_layer_interval(static_cast<int32_t>(step));
  model.set_first_dense_layers(static_cast<int32_t>(first_dense));
  moe.set_expert_ffn_hidden_size(expert_ffn);
  set_routing(config::SOFTMAX, norm_topk, moe);
  return absl::OkStatus();
}

absl::Status read_qwen2_moe(const HfFields& c, config::Recipe& recipe) {
  config::MoeConfig& moe = *recipe.mutable_moe();
  SY_RETURN_IF_ERROR(read_qwen_layers(c, recipe));
  SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("qkv_bias"));
  // 0 is a shared expert of no width, which adds nothing in transformers too.
  SY_ASSIGN_OR_RETURN(const int64_t shared_ffn,
                      c.integer("shared_expert_intermediate_size", 0, kMaxInt32));
  recipe.mutable_model()->set_attention_bias(bias);
  if (shared_ffn > 0) {
    moe.set_num_shared_experts(1);
    moe.set_shared_expert_ffn_hidden_size(shared_ffn);
    moe.set_shared_expert_gate(true);
  }
  return absl::OkStatus();
}

// Qwen3-MoE: Qwen2-MoE's layer pattern without shared experts and biases, q/k RMSNorm
// per head.
absl::Status read_qwen3_moe(const HfFields& c, config::Recipe& recipe) {
  SY_RETURN_IF_ERROR(read_qwen_layers(c, recipe));
  SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("attention_bias"));
  if (bias) return refuse(c.path(), "attention_bias", "is true: Qwen3-MoE's output projection bias has no engine counterpart");
  recipe.mutable_model()->set_qk_head_norm(true);
  return absl::OkStatus();
}

absl::Status read_olmoe(const HfFields& c, config::Recipe& recipe) {
  if (c.has("clip_qkv")) return refuse(c.path(), "clip_qkv", "is set: the engine does not clamp q, k and v");
  SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("attention_bias"));
  if (bias) return refuse(c.path(), "attention_bias", "is true: OLMoE's output projection bias has no engine counterpart");
  SY_ASSIGN_OR_RETURN(const int64_t ffn, c.integer("intermediate_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const bool norm_topk, c.boolean("norm_topk_prob"));
  recipe.mutable_model()->set_qk_norm(true);
  recipe.mutable_model()->set_moe_layer_interval(1);
  recipe.mutable_moe()->set_expert_ffn_hidden_size(ffn);
  set_routing(config::SOFTMAX, norm_topk, *recipe.mutable_moe());
  return absl::OkStatus();
}

// Llama, Mistral and Qwen2: every layer a dense SwiGLU FFN (model.moe_layer_interval 0).
// Mistral's sliding window is on unless config.json writes it as null.
absl::Status read_dense(const HfFields& c, config::Recipe& recipe) {
  config::ModelConfig& model = *recipe.mutable_model();
  const Family family = c.family();
  if (family == Family::kMistral && c.set("sliding_window"))
    return c.refuse_set("sliding_window", "the engine attends to the whole window");
  if (family == Family::kQwen2) {
    SY_ASSIGN_OR_RETURN(const bool sliding, c.boolean("use_sliding_window"));
    if (sliding) return refuse(c.path(), "use_sliding_window", "is true: the engine attends to the whole window");
  } else {
    SY_ASSIGN_OR_RETURN(const bool bias, c.file().boolean_or("attention_bias", false));
    if (bias) return refuse(c.path(), "attention_bias", "is true: its output projection bias has no engine counterpart");
  }
  SY_ASSIGN_OR_RETURN(const int64_t ffn, c.integer("intermediate_size", 1, kMaxInt32));
  model.set_ffn_hidden_size(ffn);
  model.set_moe_layer_interval(0);
  // Qwen2's q, k and v projections always have biases.
  model.set_attention_bias(family == Family::kQwen2);
  return absl::OkStatus();
}

// A string field that, when present, must hold `expected`: a feature the engine has only
// in that form.
absl::Status require_string(const JsonFields& c, const char* key, const std::string& expected,
                            const std::string& why) {
  if (!c.has(key)) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(const std::string value, c.string(key));
  if (value == expected) return absl::OkStatus();
  return refuse(c.path(), key, absl::StrCat("\"", value.substr(0, 64), "\": ", why));
}

// DeepSeek-V3's latent attention (model.mla). q_lora_rank null is queries straight from
// the hidden state, as transformers reads it.
absl::Status read_latent_attention(const HfFields& c, config::MlaConfig& mla) {
  int64_t q_rank = 0;  // the recipe's "no query latent"
  if (!c.is_null("q_lora_rank")) {
    SY_ASSIGN_OR_RETURN(q_rank, c.integer("q_lora_rank", 1, kMaxInt32));
  }
  SY_ASSIGN_OR_RETURN(const int64_t kv_rank, c.integer("kv_lora_rank", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t nope, c.integer("qk_nope_head_dim", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t rope, c.integer("qk_rope_head_dim", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t v, c.integer("v_head_dim", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const bool bias, c.boolean("attention_bias"));
  if (bias) return refuse(c.path(), "attention_bias", "is true: the engine's latent attention has no biases");
  mla.set_q_lora_rank(q_rank);
  mla.set_kv_lora_rank(kv_rank);
  mla.set_qk_nope_head_dim(static_cast<int32_t>(nope));
  mla.set_qk_rope_head_dim(static_cast<int32_t>(rope));
  mla.set_v_head_dim(static_cast<int32_t>(v));
  return absl::OkStatus();
}

// DeepSeek-V3: latent attention, first_k_dense_replace dense layers (0: none), shared
// experts of the routed experts' width (0: none, as transformers' zero-width shared MLP
// adds nothing), sigmoid group-limited routing with the correction bias. topk_method,
// scoring_func and moe_layer_freq are the original checkpoints' fields, not transformers':
// when present they must name what the engine does.
absl::Status read_deepseek_v3(const HfFields& c, config::Recipe& recipe) {
  config::ModelConfig& model = *recipe.mutable_model();
  config::MoeConfig& moe = *recipe.mutable_moe();
  if (c.has("quantization_config"))
    return refuse(c.path(), "quantization_config", "is set: the engine reads F32, BF16 or F16 weights");
  SY_RETURN_IF_ERROR(require_string(c.file(), "topk_method", "noaux_tc",
                                    "the engine routes by score + correction bias (noaux_tc)"));
  SY_RETURN_IF_ERROR(require_string(c.file(), "scoring_func", "sigmoid", "the engine's DeepSeek router is sigmoid"));
  SY_ASSIGN_OR_RETURN(const int64_t freq, c.file().integer_or("moe_layer_freq", 1, 0, kMaxInt32));
  if (freq != 1) return refuse(c.path(), "moe_layer_freq", "is not 1: the engine's MoE layers follow the dense ones");
  SY_RETURN_IF_ERROR(read_latent_attention(c, *model.mutable_mla()));
  SY_ASSIGN_OR_RETURN(const int64_t dense, c.integer("first_k_dense_replace", 0, model.num_layers()));
  SY_ASSIGN_OR_RETURN(const int64_t dense_ffn, c.integer("intermediate_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t expert_ffn, c.integer("moe_intermediate_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t shared, c.integer("n_shared_experts", 0, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const bool norm_topk, c.boolean("norm_topk_prob"));
  SY_ASSIGN_OR_RETURN(const float scaling, c.positive("routed_scaling_factor"));
  SY_ASSIGN_OR_RETURN(const int64_t groups, c.integer("n_group", 1, moe.num_experts()));
  SY_ASSIGN_OR_RETURN(const int64_t top_groups, c.integer("topk_group", 1, groups));
  model.set_first_dense_layers(static_cast<int32_t>(dense));
  model.set_moe_layer_interval(1);
  model.set_ffn_hidden_size(dense_ffn);
  set_routing(config::SIGMOID, norm_topk, moe);
  moe.set_expert_ffn_hidden_size(expert_ffn);
  moe.set_num_shared_experts(static_cast<int32_t>(shared));
  moe.set_shared_expert_ffn_hidden_size(shared > 0 ? expert_ffn : 0);
  moe.set_routed_scaling_factor(scaling);
  moe.set_num_groups(static_cast<int32_t>(groups));
  moe.set_top_groups(static_cast<int32_t>(top_groups));
  return absl::OkStatus();
}

// The key of the routed experts' count: Mixtral's num_local_experts, DeepSeek-V3's
// n_routed_experts, the others' num_experts, which transformers 5.x writes as
// num_local_experts for Qwen3-MoE.
const char* experts_key(const HfFields& c) {
  if (c.family() == Family::kMixtral) return "num_local_experts";
  if (c.family() == Family::kDeepseekV3) return "n_routed_experts";
  if (c.family() == Family::kQwen3Moe && !c.written("num_experts") && c.written("num_local_experts"))
    return "num_local_experts";
  return "num_experts";
}

// The fields every family shares. num_key_value_heads null, or absent where transformers'
// default is None, is num_attention_heads; head_dim null or absent is hidden_size /
// num_attention_heads (the recipe's head_dim 0), as transformers derives them.
absl::Status read_common(const HfFields& c, config::Recipe& recipe) {
  config::ModelConfig& model = *recipe.mutable_model();
  SY_ASSIGN_OR_RETURN(const std::string act, c.string("hidden_act"));
  if (act != "silu")
    return refuse(c.path(), "hidden_act", absl::StrCat("\"", act.substr(0, 64), "\": the engine's FFNs are SwiGLU (silu)"));
  SY_ASSIGN_OR_RETURN(const bool mlp_bias, c.file().boolean_or("mlp_bias", false));
  if (mlp_bias) return refuse(c.path(), "mlp_bias", "is true: the engine's FFNs have no biases");

  SY_ASSIGN_OR_RETURN(const int64_t vocab, c.integer("vocab_size", 1, kMaxVocabSize));
  SY_ASSIGN_OR_RETURN(const int64_t hidden, c.integer("hidden_size", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t layers, c.integer("num_hidden_layers", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t heads, c.integer("num_attention_heads", 1, kMaxInt32));
  int64_t kv_heads = heads, head_dim = 0;
  if (c.set("num_key_value_heads")) {
    SY_ASSIGN_OR_RETURN(kv_heads, c.integer("num_key_value_heads", 1, heads));
  }
  if (c.has("head_dim")) {
    SY_ASSIGN_OR_RETURN(head_dim, c.integer("head_dim", 1, kMaxInt32));
  }
  SY_ASSIGN_OR_RETURN(const int64_t max_positions,
                      c.integer("max_position_embeddings", 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const float eps, c.positive("rms_norm_eps"));
  SY_ASSIGN_OR_RETURN(const float init_std, c.positive("initializer_range"));
  SY_ASSIGN_OR_RETURN(const bool tie, c.boolean("tie_word_embeddings"));
  model.set_vocab_size(vocab);
  model.set_hidden_size(hidden);
  model.set_num_layers(static_cast<int32_t>(layers));
  model.set_num_heads(static_cast<int32_t>(heads));
  model.set_num_kv_heads(static_cast<int32_t>(kv_heads));
  model.set_head_dim(static_cast<int32_t>(head_dim));
  model.set_norm_eps(eps);
  model.set_init_std(init_std);
  model.set_tie_embeddings(tie);
  model.set_max_position_embeddings(max_positions);
  return read_rope(c, model);
}

// The routed experts' count, top-k and aux loss weight (0: none) of the MoE families.
absl::Status read_routing(const HfFields& c, config::MoeConfig& moe) {
  SY_ASSIGN_OR_RETURN(const int64_t experts, c.integer(experts_key(c), 1, kMaxInt32));
  SY_ASSIGN_OR_RETURN(const int64_t top_k, c.integer("num_experts_per_tok", 1, experts));
  SY_ASSIGN_OR_RETURN(const float aux_coef, c.non_negative("router_aux_loss_coef"));
  moe.set_num_experts(static_cast<int32_t>(experts));
  moe.set_top_k(static_cast<int32_t>(top_k));
  moe.set_aux_loss_coef(aux_coef);
  return absl::OkStatus();
}

absl::StatusOr<config::Recipe> recipe_from_config(const HfFields& c, const std::string& name) {
  config::Recipe recipe;
  recipe.set_name(name);
  SY_RETURN_IF_ERROR(read_common(c, recipe));
  if (!is_dense(c.family())) SY_RETURN_IF_ERROR(read_routing(c, *recipe.mutable_moe()));
  switch (c.family()) {
    case Family::kMixtral: SY_RETURN_IF_ERROR(read_mixtral(c, recipe)); break;
    case Family::kQwen2Moe: SY_RETURN_IF_ERROR(read_qwen2_moe(c, recipe)); break;
    case Family::kQwen3Moe: SY_RETURN_IF_ERROR(read_qwen3_moe(c, recipe)); break;
    case Family::kOlmoe: SY_RETURN_IF_ERROR(read_olmoe(c, recipe)); break;
    case Family::kDeepseekV3: SY_RETURN_IF_ERROR(read_deepseek_v3(c, recipe)); break;
    case Family::kLlama:
    case Family::kMistral:
    case Family::kQwen2: SY_RETURN_IF_ERROR(read_dense(c, recipe)); break;
  }
  // Training settings are placeholders that make the recipe valid for `sample` and
  // `eval`; training it starts from the imported weights beside it, once its data (and
  // schedule) are set with --set.
  recipe.mutable_optimizer()->set_lr(1e-4f);
  recipe.mutable_optimizer()->set_decay(config::CONSTANT);
  recipe.mutable_train()->set_global_batch_size(1);
  recipe.mutable_train()->set_seq_len(recipe.model().max_position_embeddings());
  recipe.mutable_data()->set_dataset(config::kPlaceholderDataset);
  recipe.mutable_train()->set_init_from(".");
  config::fill_defaults(recipe);
  const absl::Status valid = config::validate_recipe(recipe);
  if (!valid.ok())
    return absl::InvalidArgumentError(absl::StrCat(c.path(), ": gives an invalid recipe: ", valid.message()));
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

// The safetensors files of `dir`: model.safetensors, or the shards its index names, each
// kept inside `dir`.
absl::StatusOr<std::vector<std::string>> hf_weight_files(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(single, ec))) return std::vector<std::string>{single};
  if (!fs::exists(fs::symlink_status(index_path, ec)))
    return absl::NotFoundError(
        absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(index_path));
  SY_ASSIGN_OR_RETURN(const auto weight_map, parse_hf_weight_map(text, index_path));
  std::map<std::string, std::string> first_tensor;  // shard file -> a tensor naming it
  for (const auto& [tensor, file] : weight_map) first_tensor.emplace(file, tensor);
  std::vector<std::string> files;
  for (const auto& [file, tensor] : first_tensor) {
    SY_ASSIGN_OR_RETURN(std::string path,
                        path_in_directory(dir, file,
                                          absl::StrCat(index_path, ": field weight_map.", tensor)));
    files.push_back(std::move(path));
  }
  return files;
}

// A lower bound on the bytes that hold the parameters of `recipe`, at 2 bytes each (BF16
// or F16), counted in double so that no size a config.json declares overflows.
double min_model_bytes(const config::Recipe& recipe) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  const double H = model.hidden_size(), hd = config::effective_head_dim(model);
  const double q = model.num_heads() * hd, kv = config::effective_kv_heads(model) * hd;
  const double moe_ffn = moe.num_experts() * (H + 3.0 * moe.expert_ffn_hidden_size() * H) +
                         3.0 * moe.num_shared_experts() * moe.shared_expert_ffn_hidden_size() * H;
  const config::MlaConfig& mla = model.mla();
  const double heads = model.num_heads(), qk = mla.qk_nope_head_dim() + mla.qk_rope_head_dim();
  const double q_rank = mla.q_lora_rank(), kv_rank = mla.kv_lora_rank();
  const double latent = (q_rank > 0 ? q_rank * (H + heads * qk) : heads * qk * H) +
                        (kv_rank + mla.qk_rope_head_dim()) * H +
                        heads * kv_rank * (mla.qk_nope_head_dim() + mla.v_head_dim()) +
                        H * heads * mla.v_head_dim();
  const double attention = kv_rank > 0 ? latent : H * (2 * q + 2 * kv);
  double params = model.vocab_size() * H * (model.tie_embeddings() ? 1 : 2);
  for (int layer = 0; layer < model.num_layers(); ++layer)
    params += attention +
              (config::is_moe_layer(recipe, layer) ? moe_ffn : 3.0 * model.ffn_hidden_size() * H);
  return 2 * params;
}

// The model config.json describes must fit in the bytes of the files that hold it,
// checked before any of it is allocated.
absl::Status check_files_hold_model(const config::Recipe& recipe,
                                    const std::vector<std::string>& files,
                                    const std::string& config_path) {
  SY_ASSIGN_OR_RETURN(const int64_t file_bytes, total_file_bytes(files));
  const double need = min_model_bytes(recipe);
  if (need > static_cast<double>(file_bytes))
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: describes a model of at least %.4g bytes, more than its safetensors files' %d",
        config_path, need, file_bytes));
  return absl::OkStatus();
}

// Every tensor of `files` in f32, under names with Mixtral's `block_sparse_moe` read as
// `mlp` (transformers 5.x's own spelling).
absl::StatusOr<std::map<std::string, Tensor>> read_hf_tensors(const std::vector<std::string>& files) {
  std::map<std::string, Tensor> out;
  for (const std::string& path : files) {
    SY_ASSIGN_OR_RETURN(auto tensors, read_safetensors(path));
    for (auto& [name, tensor] : tensors) {
      std::string key = name;
      if (const size_t at = key.find(".block_sparse_moe."); at != std::string::npos)
        key.replace(at, std::strlen(".block_sparse_moe."), ".mlp.");
      if (out.count(key))
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", name, " is also in another file"));
      SY_ASSIGN_OR_RETURN(Tensor f32, to_f32(tensor, name, path));
      SY_RETURN_IF_ERROR(check_finite(f32, path, name));
      out.emplace(std::move(key), std::move(f32));
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
  const std::string& source() const { return source_; }

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

// One layer's latent attention; the rotary rows of q_b_proj (or q_proj) and
// kv_a_proj_with_mqa reordered from interleaved pairs when `rope_interleave`.
absl::Status map_latent_attention(const config::ModelConfig& model, bool rope_interleave,
                                  const std::string& attn, TensorMapper& m) {
  const config::MlaConfig& mla = model.mla();
  const int64_t H = model.hidden_size(), heads = model.num_heads(), nope = mla.qk_nope_head_dim(),
                rope = mla.qk_rope_head_dim(), qk = nope + rope, v = mla.v_head_dim(),
                qr = mla.q_lora_rank(), kr = mla.kv_lora_rank();
  auto rotary = [&](const std::string& name, const Shape& shape, int64_t block,
                    int64_t offset) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor w, m.take(attn + name, shape));
    m.emit(attn + name, rope_interleave ? reorder_rope_rows(w, block, offset, rope, false) : w);
    return absl::OkStatus();
  };
  if (qr > 0) {
    SY_RETURN_IF_ERROR(m.move(attn + "q_a_proj.weight", attn + "q_a_proj.weight", {qr, H}));
    SY_RETURN_IF_ERROR(m.move(attn + "q_a_layernorm.weight", attn + "q_a_layernorm.weight", {qr}));
    SY_RETURN_IF_ERROR(rotary("q_b_proj.weight", {heads * qk, qr}, qk, nope));
  } else {
    SY_RETURN_IF_ERROR(rotary("q_proj.weight", {heads * qk, H}, qk, nope));
  }
  SY_RETURN_IF_ERROR(rotary("kv_a_proj_with_mqa.weight", {kr + rope, H}, kr + rope, kr));
  SY_RETURN_IF_ERROR(m.move(attn + "kv_a_layernorm.weight", attn + "kv_a_layernorm.weight", {kr}));
  SY_RETURN_IF_ERROR(
      m.move(attn + "kv_b_proj.weight", attn + "kv_b_proj.weight", {heads * (nope + v), kr}));
  return m.move(attn + "o_proj.weight", attn + "o_proj.weight", {H, heads * v});
}

// One layer's grouped-query attention, its biases and q/k norms.
absl::Status map_attention(const config::ModelConfig& model, const std::string& attn,
                           TensorMapper& m) {
  const int64_t H = model.hidden_size(), hd = config::effective_head_dim(model);
  const int64_t q = model.num_heads() * hd, kv = config::effective_kv_heads(model) * hd;
  const std::vector<std::pair<std::string, int64_t>> projections = {
      {"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
  for (const auto& [proj, rows] : projections) {
    SY_RETURN_IF_ERROR(m.move(attn + proj + ".weight", attn + proj + ".weight", {rows, H}));
    if (model.attention_bias())
      SY_RETURN_IF_ERROR(m.move(attn + proj + ".bias", attn + proj + ".bias", {rows}));
  }
  SY_RETURN_IF_ERROR(m.move(attn + "o_proj.weight", attn + "o_proj.weight", {H, q}));
  if (model.qk_norm() || model.qk_head_norm()) {
    SY_RETURN_IF_ERROR(m.move(attn + "q_norm.weight", attn + "q_norm.weight",
                              {model.qk_head_norm() ? hd : q}));
    SY_RETURN_IF_ERROR(m.move(attn + "k_norm.weight", attn + "k_norm.weight",
                              {model.qk_head_norm() ? hd : kv}));
  }
  return absl::OkStatus();
}

// Multi-token prediction module k of a DeepSeek-V3 checkpoint, layer num_layers + k - 1:
// its decoder layer (map_layer), its norms and eh_proj, and the copies of the embedding
// and the LM head it may store, which must be the model's own (the engine shares them).
absl::Status map_mtp_module(const config::ModelConfig& model, int k, const Tensor& embedding,
                            const Tensor& head, const std::function<absl::Status(int)>& map_layer,
                            TensorMapper& m) {
  const int64_t V = model.vocab_size(), H = model.hidden_size();
  const int layer = model.num_layers() + k - 1;
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  SY_RETURN_IF_ERROR(map_layer(layer));
  for (const char* norm : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
    SY_RETURN_IF_ERROR(m.move(p + norm, p + norm, {H}));
  SY_RETURN_IF_ERROR(m.move(p + "eh_proj.weight", p + "eh_proj.weight", {H, 2 * H}));
  const std::pair<const char*, const Tensor*> copies[] = {
      {"embed_tokens.weight", &embedding}, {"shared_head.head.weight", &head}};
  for (const auto& [name, shared] : copies) {
    if (!m.has(p + name)) continue;
    SY_ASSIGN_OR_RETURN(const Tensor copy, m.take(p + name, {V, H}));
    if (std::memcmp(copy.data<float>(), shared->data<float>(), copy.nbytes()) != 0)
      return absl::UnimplementedError(absl::StrCat(
          m.source(), ": tensor ", p, name, " differs from the model's own: the engine's "
          "multi-token prediction modules share the model's embedding and LM head"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> map_tensors(
    const config::Recipe& recipe, Family family, bool rope_interleave, TensorMapper& m) {
  const config::ModelConfig& model = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  const int64_t V = model.vocab_size(), H = model.hidden_size();
  const int64_t E = moe.num_experts(), I = moe.expert_ffn_hidden_size();
  const char* gate_name = family == Family::kMixtral ? "w1" : "gate_proj";
  const char* up_name = family == Family::kMixtral ? "w3" : "up_proj";
  const char* down_name = family == Family::kMixtral ? "w2" : "down_proj";

  // Decoder layer `layer`'s tensors (a main layer's, or a multi-token prediction module's).
  auto map_layer = [&](int layer) -> absl::Status {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    const std::string attn = p + "self_attn.";
    SY_RETURN_IF_ERROR(m.move(p + "input_layernorm.weight", p + "input_layernorm.weight", {H}));
    SY_RETURN_IF_ERROR(model.mla().kv_lora_rank() > 0
                           ? map_latent_attention(model, rope_interleave, attn, m)
                           : map_attention(model, attn, m));
    SY_RETURN_IF_ERROR(
        m.move(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight", {H}));
    const std::string mlp = p + "mlp.";
    if (!config::is_moe_layer(recipe, layer)) {
      const int64_t F = model.ffn_hidden_size();
      SY_ASSIGN_OR_RETURN(Tensor fused,
                          m.fuse({{mlp + "gate_proj.weight", mlp + "up_proj.weight"}}, F, H));
      m.emit(mlp + "gate_up_proj.weight", fused.reshape({2, F, H}));
      SY_RETURN_IF_ERROR(m.move(mlp + "down_proj.weight", mlp + "down_proj.weight", {H, F}));
      return absl::OkStatus();
    }
    SY_RETURN_IF_ERROR(m.move(mlp + "gate.weight", mlp + "gate.weight", {E, H}));
    if (moe.score_function() == config::SIGMOID)
      SY_RETURN_IF_ERROR(m.move(mlp + "gate.e_score_correction_bias",
                                mlp + "gate.e_score_correction_bias", {E}));
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
      // The engine runs its shared experts as one FFN of their summed width.
      const int64_t S = moe.num_shared_experts() * moe.shared_expert_ffn_hidden_size();
      const std::string shared =
          mlp + (family == Family::kDeepseekV3 ? "shared_experts." : "shared_expert.");
      const std::string ours = mlp + "shared_expert.";
      SY_ASSIGN_OR_RETURN(Tensor fused,
                          m.fuse({{shared + "gate_proj.weight", shared + "up_proj.weight"}}, S, H));
      m.emit(ours + "gate_up_proj.weight", fused.reshape({2, S, H}));
      SY_RETURN_IF_ERROR(m.move(shared + "down_proj.weight", ours + "down_proj.weight", {H, S}));
      if (moe.shared_expert_gate())
        SY_RETURN_IF_ERROR(
            m.move(mlp + "shared_expert_gate.weight", mlp + "shared_expert_gate.weight", {1, H}));
    }
    return absl::OkStatus();
  };
  SY_ASSIGN_OR_RETURN(const Tensor embedding, m.take("model.embed_tokens.weight", {V, H}));
  m.emit("model.embed_tokens.weight", embedding);
  for (int layer = 0; layer < model.num_layers(); ++layer) SY_RETURN_IF_ERROR(map_layer(layer));
  SY_RETURN_IF_ERROR(m.move("model.norm.weight", "model.norm.weight", {H}));
  Tensor head = embedding;
  if (!model.tie_embeddings()) {
    SY_ASSIGN_OR_RETURN(head, m.take("lm_head.weight", {V, H}));
    m.emit("lm_head.weight", head);
  } else if (m.has("lm_head.weight")) {
    // A tied model may still store its (identical) output matrix.
    SY_RETURN_IF_ERROR(m.take("lm_head.weight", {V, H}).status());
  }
  for (int k = 1; k <= model.mtp_depth(); ++k)
    SY_RETURN_IF_ERROR(map_mtp_module(model, k, embedding, head, map_layer, m));
  return m.finish();
}

// config.json read as a recipe, with the family whose tensor names the directory uses.
struct HfConfig {
  config::Recipe recipe;
  Family family;
  bool rope_interleave = false;  // DeepSeek-V3's rotary channels in interleaved pairs
  // DeepSeek-V3's num_nextn_predict_layers: the multi-token prediction modules it may
  // hold (transformers writes 1 and saves none; mtp_modules_held counts those present).
  int64_t mtp_layers = 0;
};

// As many as model.mtp_depth takes.
constexpr int64_t kMaxMtpLayers = 8;

// The multi-token prediction modules of `config` whose tensors `tensors` holds: modules
// 1, 2, ... while module k's eh_proj (layer num_layers + k - 1) is there.
int32_t mtp_modules_held(const HfConfig& config, const std::map<std::string, Tensor>& tensors) {
  int32_t held = 0;
  const int32_t layers = config.recipe.model().num_layers();
  while (held < config.mtp_layers &&
         tensors.count(absl::StrCat("model.layers.", layers + held, ".eh_proj.weight")) > 0)
    ++held;
  return held;
}

// Which families a reader takes: convert from-hf the MoE ones, convert upcycle the dense
// ones, the config parser alone both.
enum class Kind { kAny, kMoe, kDense };

absl::StatusOr<HfConfig> parse_config(std::string_view json, const std::string& path,
                                      const std::string& name, Kind kind) {
  SY_ASSIGN_OR_RETURN(const Json j, parse_json_object(json, path));
  const JsonFields file(j, path);
  HfConfig out;
  SY_ASSIGN_OR_RETURN(out.family, family_of(file));
  if (kind == Kind::kMoe && is_dense(out.family))
    return refuse(path, "model_type", "is a dense model: switchyard convert upcycle makes a mixture of experts of it");
  if (kind == Kind::kDense && !is_dense(out.family))
    return refuse(path, "model_type", "is a mixture of experts: switchyard convert from-hf imports it");
  const HfFields c(file, out.family);
  SY_ASSIGN_OR_RETURN(out.recipe, recipe_from_config(c, name));
  if (out.family == Family::kDeepseekV3) {
    SY_ASSIGN_OR_RETURN(out.rope_interleave, c.boolean("rope_interleave"));
    SY_ASSIGN_OR_RETURN(out.mtp_layers,
                        file.integer_or("num_nextn_predict_layers", 0, 0, kMaxMtpLayers));
  }
  return out;
}

// The directory's tokenizer.model, kept inside it and fitting the model's vocabulary;
// empty when there is none.
absl::StatusOr<std::string> hf_tokenizer(const std::string& dir, const config::Recipe& recipe) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dir + "/tokenizer.model", ec))) return std::string();
  SY_ASSIGN_OR_RETURN(const std::string path,
                      path_in_directory(dir, "tokenizer.model", absl::StrCat(dir, ": tokenizer")));
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(path));
  SY_RETURN_IF_ERROR(check_tokenizer_fits(tokenizer, path, recipe));
  return path;
}

// The directory's model, of a family of `kind`.
absl::StatusOr<HfModel> read_hf_directory(const std::string& hf_dir, Kind kind) {
  const std::string config_path = hf_dir + "/config.json";
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(config_path));
  fs::path dir = fs::path(hf_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  SY_ASSIGN_OR_RETURN(HfConfig config,
                      parse_config(text, config_path, dir.filename().string(), kind));
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> files, hf_weight_files(hf_dir));
  SY_RETURN_IF_ERROR(check_files_hold_model(config.recipe, files, config_path));
  SY_ASSIGN_OR_RETURN(auto hf_tensors, read_hf_tensors(files));
  config.recipe.mutable_model()->set_mtp_depth(mtp_modules_held(config, hf_tensors));
  if (const absl::Status valid = config::validate_recipe(config.recipe); !valid.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": gives an invalid recipe: ", valid.message()));
  HfModel out;
  out.recipe = config.recipe;
  SY_ASSIGN_OR_RETURN(out.tokenizer_path, hf_tokenizer(hf_dir, config.recipe));
  TensorMapper mapper(std::move(hf_tensors), hf_dir);
  SY_ASSIGN_OR_RETURN(out.tensors, map_tensors(config.recipe, config.family, config.rope_interleave, mapper));
  return out;
}

}  // namespace

Tensor reorder_rope_rows(const Tensor& weight, int64_t block, int64_t offset, int64_t rope,
                         bool to_interleaved) {
  SY_CHECK_MSG(weight.dtype() == DType::kF32 && weight.rank() == 2 && block > 0 &&
                   weight.dim(0) % block == 0 && offset + rope <= block && rope % 2 == 0,
               "reorder_rope_rows: rows do not form blocks holding the rotary rows");
  Tensor out = Tensor::empty(weight.shape(), DType::kF32);
  out.copy_from(weight);
  const int64_t cols = weight.dim(1), half = rope / 2;
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
  for (int64_t b = 0; b < weight.dim(0) / block; ++b) {
    for (int64_t j = 0; j < rope; ++j) {
      // The engine's row j (halves) is interleaved row 2j, or 2(j - half) + 1.
      const int64_t paired = j < half ? 2 * j : 2 * (j - half) + 1;
      const int64_t halves_row = b * block + offset + j, pairs_row = b * block + offset + paired;
      const int64_t from = to_interleaved ? halves_row : pairs_row;
      const int64_t to = to_interleaved ? pairs_row : halves_row;
      std::memcpy(out.data<float>() + to * cols, weight.data<float>() + from * cols, row_bytes);
    }
  }
  return out;
}

absl::StatusOr<config::Recipe> recipe_from_hf_config_text(std::string_view json,
                                                          const std::string& path,
                                                          const std::string& name) {
  SY_ASSIGN_OR_RETURN(HfConfig config, parse_config(json, path, name, Kind::kAny));
  return std::move(config.recipe);
}

absl::StatusOr<std::map<std::string, std::string>> parse_hf_weight_map(std::string_view json,
                                                                       const std::string& path) {
  SY_ASSIGN_OR_RETURN(const Json j, parse_json_object(json, path));
  SY_ASSIGN_OR_RETURN(const JsonFields weight_map, JsonFields(j, path).object("weight_map"));
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : weight_map.json().items()) {
    if (!file.is_string()) return weight_map.error(tensor, "must be a file name");
    out.emplace(tensor, file.get<std::string>());
  }
  return out;
}

absl::StatusOr<HfModel> read_hf_model(const std::string& hf_dir) {
  return read_hf_directory(hf_dir, Kind::kMoe);
}

absl::StatusOr<HfModel> read_hf_dense_model(const std::string& hf_dir) {
  return read_hf_directory(hf_dir, Kind::kDense);
}

}  // namespace switchyard
