#include "core/config/recipe.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/config/vocab_limit.h"
#include "core/runtime/exact_sum.h"
#include "core/runtime/file_util.h"
#include "core/runtime/numbers.h"
#include "core/runtime/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/unknown_field_set.h"

namespace switchyard::config {
namespace {

namespace pb = google::protobuf;

// Debian's Abseil is built with its own absl::string_view, distinct from
// std::string_view, so the public std::string_view arguments are converted once here.
absl::string_view to_absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string field_names(const pb::Descriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.field_count(); ++i) names.push_back(descriptor.field(i)->name());
  return absl::StrJoin(names, ", ");
}

// The gatings that also named a score function and a renormalisation, before those were
// settings of their own: a recipe that still names one is refused with the new spelling,
// and a checkpoint that holds one (by its number, now reserved) is read as it.
struct LegacyGating {
  int number;
  absl::string_view name;
  ScoreFunction score_function;
  // Unset: moe.norm_topk_prob's value.
  std::optional<bool> renormalize;
  absl::string_view now;
};
constexpr LegacyGating kLegacyGatings[] = {
    {1, "TOPK_SOFTMAX", SOFTMAX, true,
     "moe.gating: TOP_K with moe.score_function: SOFTMAX and moe.renormalize: true"},
    {2, "SOFTMAX_TOPK", SOFTMAX, false,
     "moe.gating: TOP_K with moe.score_function: SOFTMAX and moe.renormalize: false"},
    {4, "SIGMOID_TOPK", SIGMOID, std::nullopt,
     "moe.gating: TOP_K with moe.score_function: SIGMOID (and moe.norm_topk_prob is now "
     "moe.renormalize)"},
};
// moe.norm_topk_prob's field number, now reserved.
constexpr int kLegacyNormTopkProb = 12;

// The refusal of a setting spelled as before the split ("moe.gating" and a legacy name,
// or "moe.norm_topk_prob" with any value), or "" for any other.
std::string legacy_routing_refusal(absl::string_view path, absl::string_view value) {
  if (path == "moe.norm_topk_prob")
    return "moe.norm_topk_prob is now moe.renormalize (and moe.gating: SIGMOID_TOPK is now "
           "moe.gating: TOP_K with moe.score_function: SIGMOID)";
  if (path != "moe.gating") return "";
  for (const LegacyGating& legacy : kLegacyGatings)
    if (value == legacy.name)
      return absl::StrCat("moe.gating: ", legacy.name, " is now ", legacy.now);
  return "";
}

// Keeps the first error only: later ones are usually consequences of it.
class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(absl::string_view text) : text_(text) {}

  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line;
    column_ = column;
    message_ = message;
  }

  bool has_error() const { return has_error_; }

  // "<source>:<line>:<col>: <message>", 1-based like compilers print them.
  std::string format(absl::string_view source_name) const {
    int column = column_;
    std::string message = message_;
    // protobuf reports at the token after the one at fault: point at that one.
    auto point_at = [&](absl::string_view token) {
      const std::vector<absl::string_view> lines = absl::StrSplit(text_, '\n');
      if (line_ >= static_cast<int>(lines.size())) return;
      const size_t start = lines[line_].substr(0, column_).rfind(token);
      if (start != absl::string_view::npos) column = static_cast<int>(start);
    };
    // `Message type "T" has no field named "f".`: list the valid fields, since the usual
    // cause is a typo.
    absl::string_view rest = message_;
    std::vector<absl::string_view> parts;
    if (absl::ConsumePrefix(&rest, "Message type \"")) {
      parts = absl::StrSplit(rest, "\" has no field named \"");
    }
    if (parts.size() == 2 && absl::ConsumeSuffix(&parts[1], "\".")) {
      const pb::Descriptor* descriptor =
          pb::DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(parts[0]));
      if (descriptor != nullptr) {
        message = absl::StrCat("unknown field \"", parts[1], "\" in ", parts[0],
                               " (valid fields: ", field_names(*descriptor), ")");
      }
      if (descriptor == MoeConfig::descriptor()) {
        const std::string legacy = legacy_routing_refusal(absl::StrCat("moe.", parts[1]), "");
        if (!legacy.empty()) message = legacy;
      }
      point_at(parts[1]);
    }
    // `Unknown enumeration value of "V" for field "f".`: the schema's one field named
    // gating is moe's.
    rest = message_;
    if (absl::ConsumePrefix(&rest, "Unknown enumeration value of \"")) {
      parts = absl::StrSplit(rest, "\" for field \"");
      if (parts.size() == 2 && parts[1] == "gating\".") {
        const std::string legacy = legacy_routing_refusal("moe.gating", parts[0]);
        if (!legacy.empty()) {
          message = legacy;
          point_at(parts[0]);
        }
      }
    }
    return absl::StrCat(source_name, ":", line_ + 1, ":", column + 1, ": ", message);
  }

 private:
  absl::string_view text_;
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

absl::StatusOr<Recipe> parse_without_defaults(absl::string_view text,
                                              absl::string_view source_name) {
  Recipe recipe;
  FirstErrorCollector errors(text);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &recipe)) {
    if (!errors.has_error()) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": invalid recipe"));
    }
    return absl::InvalidArgumentError(errors.format(source_name));
  }
  return recipe;
}

// An unset interval follows moe.num_experts, so a recipe that configures experts gets
// MoE layers without also having to say which layers.
int32_t effective_moe_layer_interval(const Recipe& recipe) {
  if (recipe.model().has_moe_layer_interval()) return recipe.model().moe_layer_interval();
  return recipe.moe().num_experts() > 0 ? 1 : 0;
}

absl::Status invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// The checks below are written as `if (!(value > 0))` so that NaN fails them too;
// infinities fail them as well.
template <typename T>
bool finite(T value) {
  if constexpr (std::is_floating_point_v<T>) return std::isfinite(value);
  return true;
}

template <typename T>
absl::Status check_positive(absl::string_view path, T value) {
  if (!(value > 0) || !finite(value))
    return invalid(absl::StrCat(path, " (", value, ") must be > 0 and finite"));
  return absl::OkStatus();
}

template <typename T>
absl::Status check_non_negative(absl::string_view path, T value) {
  if (!(value >= 0) || !finite(value))
    return invalid(absl::StrCat(path, " (", value, ") must be >= 0 and finite"));
  return absl::OkStatus();
}

// Upper bounds on the sizes that shape tensors: far beyond any published model, and
// small enough that no product of them (a parameter count, its bytes) overflows int64.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxMtpDepth = 8;
constexpr int64_t kMaxLossCoef = 1000;
constexpr int64_t kMaxHiddenSize = 65536;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxFfnSize = 262144;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxSharedExperts = 64;
// moe.num_groups: as many as the sigmoid router's group mask holds (kMaxExpertGroups in
// kernels/top_k_selection.h).
constexpr int64_t kMaxExpertGroups = 64;
constexpr int64_t kMaxTokensPerSequence = int64_t{1} << 24;
constexpr int64_t kMaxBatchSize = int64_t{1} << 24;
// train.eval_tokens when a recipe leaves it unset: the whole validation split of a small
// dataset, a bounded cost on a large one.
constexpr int64_t kDefaultEvalTokens = int64_t{1} << 20;
constexpr int64_t kMaxEvalTokens = int64_t{1} << 40;
constexpr int64_t kMaxThreads = 4096;
constexpr int kMaxDataSources = 256;
constexpr size_t kMaxSourceNameBytes = 64;
// optimizer.router_lr_scale: a factor far beyond any useful one.
constexpr int64_t kMaxRouterLrScale = 1000;
// optimizer.muon.ns_steps: the published iteration takes 5.
constexpr int64_t kMaxNewtonSchulz = 100;
// optimizer.muon.update_rms: AdamW's updates have an RMS of about 0.2.
constexpr int64_t kMaxMuonUpdateRms = 100;

template <typename T>
absl::Status check_at_most(absl::string_view path, T value, int64_t bound) {
  if (value > bound) return invalid(absl::StrCat(path, " (", value, ") must be <= ", bound));
  return absl::OkStatus();
}

absl::Status check_unit_interval(absl::string_view path, float value) {
  if (!(value >= 0 && value < 1)) {
    return invalid(absl::StrCat(path, " (", value, ") must be in [0, 1)"));
  }
  return absl::OkStatus();
}

bool has_dense_layer(const Recipe& recipe) {
  for (int layer = 0; layer < recipe.model().num_layers(); ++layer) {
    if (!is_moe_layer(recipe, layer)) return true;
  }
  return false;
}

// Multi-head latent attention (model.mla), when kv_lora_rank turns it on.
absl::Status validate_mla(const ModelConfig& model) {
  const MlaConfig& mla = model.mla();
  SY_RETURN_IF_ERROR(check_non_negative("model.mla.kv_lora_rank", mla.kv_lora_rank()));
  if (mla.kv_lora_rank() == 0) {
    if (mla.q_lora_rank() != 0 || mla.qk_nope_head_dim() != 0 || mla.qk_rope_head_dim() != 0 ||
        mla.v_head_dim() != 0)
      return invalid("model.mla needs kv_lora_rank > 0: its other fields apply only to latent attention");
    return absl::OkStatus();
  }
  SY_RETURN_IF_ERROR(check_at_most("model.mla.kv_lora_rank", mla.kv_lora_rank(), kMaxHiddenSize));
  SY_RETURN_IF_ERROR(check_non_negative("model.mla.q_lora_rank", mla.q_lora_rank()));
  SY_RETURN_IF_ERROR(check_at_most("model.mla.q_lora_rank", mla.q_lora_rank(), kMaxHiddenSize));
  SY_RETURN_IF_ERROR(check_positive("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim()));
  SY_RETURN_IF_ERROR(check_at_most("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim(), kMaxHeadDim));
  SY_RETURN_IF_ERROR(check_positive("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim()));
  SY_RETURN_IF_ERROR(check_at_most("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim(), kMaxHeadDim));
  if (mla.qk_rope_head_dim() % 2 != 0) {
    return invalid(absl::StrCat("model.mla.qk_rope_head_dim (", mla.qk_rope_head_dim(),
                                ") must be even: RoPE rotates pairs of dimensions"));
  }
  SY_RETURN_IF_ERROR(check_positive("model.mla.v_head_dim", mla.v_head_dim()));
  SY_RETURN_IF_ERROR(check_at_most("model.mla.v_head_dim", mla.v_head_dim(), kMaxHeadDim));
  if (model.qk_norm() || model.qk_head_norm() || model.attention_bias())
    return invalid("model.qk_norm, model.qk_head_norm and model.attention_bias do not apply to "
                   "latent attention (model.mla)");
  if (effective_kv_heads(model) != model.num_heads())
    return invalid(absl::StrCat("model.num_kv_heads (", effective_kv_heads(model),
                                ") must equal model.num_heads with latent attention (model.mla): "
                                "every head expands the one latent"));
  return absl::OkStatus();
}

// model.rope_scaling: YaRN's factors far beyond any published extension are refused, so
// that no product of them leaves float's range.
constexpr int64_t kMaxRopeScalingFactor = 65536;
absl::Status validate_rope_scaling(const RopeScaling& scaling) {
  const std::pair<const char*, float> factors[] = {
      {"model.rope_scaling.factor", scaling.factor()},
      {"model.rope_scaling.beta_fast", scaling.beta_fast()},
      {"model.rope_scaling.beta_slow", scaling.beta_slow()},
      {"model.rope_scaling.mscale", scaling.mscale()},
      {"model.rope_scaling.mscale_all_dim", scaling.mscale_all_dim()}};
  if (scaling.type() == ROPE_SCALING_NONE) {
    for (const auto& [path, value] : factors)
      if (value != 0)
        return invalid(absl::StrCat(path, " is set but model.rope_scaling.type is not YARN"));
    if (scaling.original_max_position_embeddings() != 0)
      return invalid("model.rope_scaling.original_max_position_embeddings is set but "
                     "model.rope_scaling.type is not YARN");
    return absl::OkStatus();
  }
  if (scaling.type() != YARN)
    return invalid(absl::StrCat("model.rope_scaling.type (", scaling.type(), ") is not YARN"));
  for (const auto& [path, value] : factors) {
    SY_RETURN_IF_ERROR(check_non_negative(path, value));
    SY_RETURN_IF_ERROR(check_at_most(path, value, kMaxRopeScalingFactor));
  }
  SY_RETURN_IF_ERROR(check_positive("model.rope_scaling.factor", scaling.factor()));
  // Below 1 YaRN would shrink the context, and a tiny factor makes the inverse
  // frequencies e / factor overflow to infinity.
  if (scaling.factor() < 1)
    return invalid(absl::StrCat("model.rope_scaling.factor (", scaling.factor(),
                                ") must be >= 1: YaRN extends the original context by it"));
  SY_RETURN_IF_ERROR(check_positive("model.rope_scaling.original_max_position_embeddings",
                                    scaling.original_max_position_embeddings()));
  return check_at_most("model.rope_scaling.original_max_position_embeddings",
                       scaling.original_max_position_embeddings(), kMaxTokensPerSequence);
}

// Multi-token prediction: a bounded depth whose targets fit in a window, its weight, and
// the layouts that hold its modules.
absl::Status validate_mtp(const Recipe& recipe) {
  const ModelConfig& model = recipe.model();
  SY_RETURN_IF_ERROR(check_non_negative("model.mtp_depth", model.mtp_depth()));
  SY_RETURN_IF_ERROR(check_at_most("model.mtp_depth", model.mtp_depth(), kMaxMtpDepth));
  SY_RETURN_IF_ERROR(check_non_negative("model.mtp_loss_coef", effective_mtp_loss_coef(model)));
  SY_RETURN_IF_ERROR(
      check_at_most("model.mtp_loss_coef", effective_mtp_loss_coef(model), kMaxLossCoef));
  if (model.mtp_depth() == 0) return absl::OkStatus();
  if (model.mtp_depth() + 1 >= recipe.train().seq_len())
    return invalid(absl::StrCat("model.mtp_depth (", model.mtp_depth(),
                                ") needs train.seq_len > mtp_depth + 1 (not ",
                                recipe.train().seq_len(), "): module k predicts the token k + 1 "
                                "positions ahead within a window"));
  if (effective_pipeline_size(recipe.parallel()) > 1)
    return invalid(absl::StrCat("model.mtp_depth needs parallel.pipeline_parallel_size 1 (not ",
                                recipe.parallel().pipeline_parallel_size(),
                                "): the modules read the embedding, which the first stage "
                                "holds, after the last stage's layers"));
  return absl::OkStatus();
}

absl::Status validate_model(const Recipe& recipe) {
  const ModelConfig& model = recipe.model();
  SY_RETURN_IF_ERROR(check_positive("model.vocab_size", model.vocab_size()));
  SY_RETURN_IF_ERROR(check_at_most("model.vocab_size", model.vocab_size(), kMaxVocabSize));
  SY_RETURN_IF_ERROR(check_positive("model.hidden_size", model.hidden_size()));
  SY_RETURN_IF_ERROR(check_at_most("model.hidden_size", model.hidden_size(), kMaxHiddenSize));
  SY_RETURN_IF_ERROR(check_positive("model.num_layers", model.num_layers()));
  SY_RETURN_IF_ERROR(check_at_most("model.num_layers", model.num_layers(), kMaxLayers));
  SY_RETURN_IF_ERROR(check_positive("model.num_heads", model.num_heads()));
  SY_RETURN_IF_ERROR(check_at_most("model.num_heads", model.num_heads(), kMaxHeads));
  SY_RETURN_IF_ERROR(check_non_negative("model.num_kv_heads", model.num_kv_heads()));
  const int32_t kv_heads = effective_kv_heads(model);
  if (model.num_heads() % kv_heads != 0) {
    return invalid(absl::StrCat("model.num_heads (", model.num_heads(),
                                ") must be divisible by model.num_kv_heads (", kv_heads, ")"));
  }
  SY_RETURN_IF_ERROR(check_non_negative("model.head_dim", model.head_dim()));
  if (model.head_dim() == 0 && model.hidden_size() % model.num_heads() != 0) {
    return invalid(absl::StrCat("model.hidden_size (", model.hidden_size(),
                                ") must be divisible by model.num_heads (", model.num_heads(),
                                ") when model.head_dim is unset"));
  }
  const int32_t head_dim = effective_head_dim(model);
  SY_RETURN_IF_ERROR(check_positive("model.head_dim", head_dim));
  SY_RETURN_IF_ERROR(check_at_most("model.head_dim", head_dim, kMaxHeadDim));
  if (head_dim % 2 != 0) {
    return invalid(absl::StrCat("model.head_dim (", head_dim,
                                ") must be even: RoPE rotates pairs of dimensions"));
  }
  if (model.qk_norm() && model.qk_head_norm())
    return invalid("model.qk_norm and model.qk_head_norm are exclusive: q and k are normalised "
                   "over the whole projection or per head, not both");
  SY_RETURN_IF_ERROR(check_positive("model.rope_theta", model.rope_theta()));
  SY_RETURN_IF_ERROR(validate_rope_scaling(model.rope_scaling()));
  SY_RETURN_IF_ERROR(check_positive("model.norm_eps", model.norm_eps()));
  SY_RETURN_IF_ERROR(check_positive("model.init_std", model.init_std()));
  SY_RETURN_IF_ERROR(check_non_negative("model.ffn_hidden_size", model.ffn_hidden_size()));
  SY_RETURN_IF_ERROR(check_at_most("model.ffn_hidden_size", model.ffn_hidden_size(), kMaxFfnSize));
  SY_RETURN_IF_ERROR(
      check_non_negative("model.moe_layer_interval", effective_moe_layer_interval(recipe)));
  SY_RETURN_IF_ERROR(check_non_negative("model.first_dense_layers", model.first_dense_layers()));
  if (has_dense_layer(recipe) && model.ffn_hidden_size() <= 0) {
    return invalid(absl::StrCat(
        "model.ffn_hidden_size must be > 0: some layers are dense (model.moe_layer_interval ",
        effective_moe_layer_interval(recipe), ", model.first_dense_layers ",
        model.first_dense_layers(), ", model.num_layers ", model.num_layers(), ")"));
  }
  SY_RETURN_IF_ERROR(validate_mtp(recipe));
  return validate_mla(model);
}

// The fields only the sigmoid router reads, refused with softmax scores.
absl::Status refuse_sigmoid_fields(const MoeConfig& moe) {
  const std::pair<const char*, bool> set[] = {
      {"moe.routed_scaling_factor", moe.routed_scaling_factor() != 0},
      {"moe.bias_update_rate", moe.bias_update_rate() != 0},
      {"moe.num_groups", moe.num_groups() != 0},
      {"moe.top_groups", moe.top_groups() != 0}};
  for (const auto& [field, is_set] : set)
    if (is_set)
      return invalid(absl::StrCat(field, " needs moe.score_function SIGMOID (moe.score_function "
                                  "is ", ScoreFunction_Name(moe.score_function()), ")"));
  return absl::OkStatus();
}

// Group-limited routing (DeepSeek-V3): groups rank by their two best experts, so the
// experts split evenly into groups, and the chosen groups must hold top_k experts.
absl::Status validate_sigmoid_routing(const MoeConfig& moe) {
  SY_RETURN_IF_ERROR(check_positive("moe.routed_scaling_factor", moe.routed_scaling_factor()));
  SY_RETURN_IF_ERROR(check_non_negative("moe.bias_update_rate", moe.bias_update_rate()));
  SY_RETURN_IF_ERROR(check_positive("moe.num_groups", moe.num_groups()));
  SY_RETURN_IF_ERROR(check_at_most("moe.num_groups", moe.num_groups(), kMaxExpertGroups));
  if (moe.num_experts() % moe.num_groups() != 0) {
    return invalid(absl::StrCat("moe.num_groups (", moe.num_groups(),
                                ") must divide moe.num_experts (", moe.num_experts(), ")"));
  }
  if (moe.top_groups() < 1 || moe.top_groups() > moe.num_groups()) {
    return invalid(absl::StrCat("moe.top_groups (", moe.top_groups(),
                                ") must be in [1, moe.num_groups (", moe.num_groups(), ")]"));
  }
  const int64_t reachable = int64_t{moe.num_experts()} / moe.num_groups() * moe.top_groups();
  if (moe.top_k() > reachable) {
    return invalid(absl::StrCat("moe.top_k (", moe.top_k(), ") must be <= the ", reachable,
                                " experts of moe.top_groups (", moe.top_groups(), ") groups"));
  }
  if (moe.aux_loss_coef() != 0) {
    return invalid(absl::StrCat("moe.aux_loss_coef (", moe.aux_loss_coef(),
                                ") must be 0 with moe.score_function SIGMOID: it balances by "
                                "moe.bias_update_rate"));
  }
  return absl::OkStatus();
}

// The selection, the score function and the renormalisation: GShard and expert choice
// define their weights from softmax probabilities, GShard's renormalised, expert choice's
// not (a token's weights come from the experts that took it, in any number).
absl::Status validate_gating(const MoeConfig& moe) {
  if (moe.gating() == GATING_UNSPECIFIED) return invalid("moe.gating must be set");
  if (!Gating_IsValid(moe.gating()))
    return invalid(absl::StrCat("moe.gating (", moe.gating(),
                                ") is not TOP_K, GSHARD_TOP2 or EXPERT_CHOICE"));
  if (moe.score_function() == SCORE_FUNCTION_UNSPECIFIED)
    return invalid("moe.score_function must be set");
  if (!ScoreFunction_IsValid(moe.score_function()))
    return invalid(absl::StrCat("moe.score_function (", moe.score_function(),
                                ") is not SOFTMAX or SIGMOID"));
  if (!moe.has_renormalize()) return invalid("moe.renormalize must be set");
  if (moe.gating() == TOP_K) return absl::OkStatus();
  const std::string gating = Gating_Name(moe.gating());
  if (moe.score_function() != SOFTMAX)
    return invalid(absl::StrCat("moe.score_function ", ScoreFunction_Name(moe.score_function()),
                                " needs moe.gating TOP_K: ", gating, " scores by SOFTMAX"));
  const bool renormalizes = moe.gating() == GSHARD_TOP2;
  if (moe.renormalize() != renormalizes)
    return invalid(absl::StrCat("moe.renormalize ", moe.renormalize() ? "true" : "false",
                                " does not apply to moe.gating ", gating, ": it ",
                                renormalizes ? "always renormalises its two weights"
                                             : "weights a token by its probabilities alone",
                                " (leave moe.renormalize unset)"));
  return absl::OkStatus();
}

absl::Status validate_moe(const Recipe& recipe) {
  const MoeConfig& moe = recipe.moe();
  SY_RETURN_IF_ERROR(check_non_negative("moe.num_experts", moe.num_experts()));
  SY_RETURN_IF_ERROR(check_at_most("moe.num_experts", moe.num_experts(), kMaxExperts));
  SY_RETURN_IF_ERROR(check_at_most("moe.expert_ffn_hidden_size", moe.expert_ffn_hidden_size(),
                                   kMaxFfnSize));
  SY_RETURN_IF_ERROR(check_at_most("moe.shared_expert_ffn_hidden_size",
                                   moe.shared_expert_ffn_hidden_size(), kMaxFfnSize));
  SY_RETURN_IF_ERROR(check_non_negative("moe.capacity_factor", moe.capacity_factor()));
  SY_RETURN_IF_ERROR(check_non_negative("moe.aux_loss_coef", moe.aux_loss_coef()));
  SY_RETURN_IF_ERROR(check_non_negative("moe.z_loss_coef", moe.z_loss_coef()));
  SY_RETURN_IF_ERROR(check_non_negative("moe.seq_aux_loss_coef", moe.seq_aux_loss_coef()));
  SY_RETURN_IF_ERROR(check_non_negative("moe.num_shared_experts", moe.num_shared_experts()));
  SY_RETURN_IF_ERROR(
      check_at_most("moe.num_shared_experts", moe.num_shared_experts(), kMaxSharedExperts));
  const int32_t interval = effective_moe_layer_interval(recipe);
  if (interval == 0) return absl::OkStatus();

  const std::string because = absl::StrCat(" when model.moe_layer_interval (", interval, ") > 0");
  if (moe.num_experts() <= 0) {
    return invalid(absl::StrCat("moe.num_experts (", moe.num_experts(), ") must be > 0", because));
  }
  if (moe.top_k() <= 0) {
    return invalid(absl::StrCat("moe.top_k (", moe.top_k(), ") must be > 0", because));
  }
  if (moe.top_k() > moe.num_experts()) {
    return invalid(absl::StrCat("moe.top_k (", moe.top_k(), ") must be <= moe.num_experts (",
                                moe.num_experts(), ")"));
  }
  SY_RETURN_IF_ERROR(validate_gating(moe));
  if (moe.gating() == GSHARD_TOP2 && moe.top_k() != 2) {
    return invalid(absl::StrCat("moe.top_k (", moe.top_k(), ") must be 2 with moe.gating ",
                                Gating_Name(moe.gating())));
  }
  if (moe.expert_ffn_hidden_size() <= 0) {
    return invalid(absl::StrCat("moe.expert_ffn_hidden_size (", moe.expert_ffn_hidden_size(),
                                ") must be > 0", because));
  }
  if (moe.num_shared_experts() > 0 && moe.shared_expert_ffn_hidden_size() <= 0) {
    return invalid(absl::StrCat(
        "moe.shared_expert_ffn_hidden_size (", moe.shared_expert_ffn_hidden_size(),
        ") must be > 0 when moe.num_shared_experts (", moe.num_shared_experts(), ") > 0"));
  }
  if (moe.shared_expert_gate() && moe.num_shared_experts() == 0) {
    return invalid("moe.shared_expert_gate needs moe.num_shared_experts > 0");
  }
  if (moe.gating() == EXPERT_CHOICE && moe.router_force_balance())
    return invalid("moe.router_force_balance excludes moe.gating EXPERT_CHOICE: it assigns "
                   "tokens to experts, expert choice experts to tokens");
  return moe.score_function() == SIGMOID ? validate_sigmoid_routing(moe)
                                         : refuse_sigmoid_fields(moe);
}

// The pipeline's stage and chunk counts and its layer split (docs/pipeline.md). What
// depends on the world size (the micro-batches per step) is make_layout's to check.
absl::Status validate_pipeline(const Recipe& recipe) {
  const ParallelConfig& parallel = recipe.parallel();
  SY_RETURN_IF_ERROR(
      check_non_negative("parallel.pipeline_parallel_size", parallel.pipeline_parallel_size()));
  SY_RETURN_IF_ERROR(
      check_non_negative("parallel.virtual_pipeline_size", parallel.virtual_pipeline_size()));
  if (!PipelineSchedule_IsValid(parallel.pipeline_schedule()))
    return invalid(absl::StrCat("parallel.pipeline_schedule (", parallel.pipeline_schedule(),
                                ") is not a schedule"));
  if (effective_pipeline_size(parallel) > 1 && recipe.model().tie_embeddings())
    return invalid(absl::StrCat("model.tie_embeddings needs parallel.pipeline_parallel_size 1 (not ",
                                parallel.pipeline_parallel_size(),
                                "): the embedding lives on the first stage, the LM head on the last"));
  const int64_t chunks =
      int64_t{effective_pipeline_size(parallel)} * effective_virtual_pipeline_size(parallel);
  const int32_t layers = recipe.model().num_layers();
  const auto& split = parallel.pipeline_layers();
  if (parallel.pipeline_ends_as_layers() && !split.empty())
    return invalid(
        "parallel.pipeline_ends_as_layers weighs the even split; parallel.pipeline_layers "
        "lists the split itself: set one of them");
  if (split.empty()) {
    if (chunks > layers)
      return invalid(absl::StrCat("parallel.pipeline_parallel_size x parallel.virtual_pipeline_size (",
                                  chunks, " chunks) must be <= model.num_layers (", layers,
                                  "): every chunk holds at least one layer"));
    if (parallel.pipeline_ends_as_layers() && chunks > 1 && int64_t{layers} + 2 < 2 * chunks)
      return invalid(absl::StrCat(
          "parallel.pipeline_ends_as_layers needs model.num_layers + 2 (", int64_t{layers} + 2,
          ") >= 2 x the chunks (", 2 * chunks,
          "): the first and last chunks would hold no layer beside the embedding and head"));
    return absl::OkStatus();
  }
  if (split.size() != chunks)
    return invalid(absl::StrCat("parallel.pipeline_layers has ", split.size(),
                                " entries; it needs one per chunk: parallel.pipeline_parallel_size "
                                "x parallel.virtual_pipeline_size (", chunks, ")"));
  int64_t sum = 0;
  for (int i = 0; i < split.size(); ++i) {
    if (split[i] < 1)
      return invalid(absl::StrCat("parallel.pipeline_layers[", i, "] (", split[i],
                                  ") must be >= 1: a chunk holds at least one layer"));
    sum += split[i];
  }
  if (sum != layers)
    return invalid(absl::StrCat("parallel.pipeline_layers sum to ", sum,
                                " layers; they must sum to model.num_layers (", layers, ")"));
  return absl::OkStatus();
}

// A permutation of the experts, and only where expert parallelism places them.
absl::Status validate_expert_placement(const Recipe& recipe) {
  const auto& placement = recipe.parallel().expert_placement();
  if (placement.empty()) return absl::OkStatus();
  const int32_t experts = recipe.moe().num_experts();
  if (recipe.parallel().expert_parallel_size() <= 1)
    return invalid(
        "parallel.expert_placement places experts over expert-parallel ranks: it needs "
        "parallel.expert_parallel_size > 1 (leave it empty otherwise)");
  if (placement.size() != experts)
    return invalid(absl::StrCat("parallel.expert_placement has ", placement.size(),
                                " entries; it must list each of the moe.num_experts (", experts,
                                ") experts once"));
  std::vector<bool> seen(static_cast<size_t>(experts), false);
  for (int i = 0; i < placement.size(); ++i) {
    const int32_t e = placement[i];
    if (e < 0 || e >= experts)
      return invalid(absl::StrCat("parallel.expert_placement[", i, "] (", e,
                                  ") is not an expert: it must be in [0, ", experts, ")"));
    if (seen[static_cast<size_t>(e)])
      return invalid(absl::StrCat("parallel.expert_placement[", i, "] (", e,
                                  ") lists an expert twice: it must be a permutation"));
    seen[static_cast<size_t>(e)] = true;
  }
  return absl::OkStatus();
}

absl::Status validate_parallel(const Recipe& recipe) {
  const ParallelConfig& parallel = recipe.parallel();
  SY_RETURN_IF_ERROR(
      check_positive("parallel.tensor_parallel_size", parallel.tensor_parallel_size()));
  SY_RETURN_IF_ERROR(
      check_positive("parallel.expert_parallel_size", parallel.expert_parallel_size()));
  if (parallel.zero_stage() < 0 || parallel.zero_stage() > 3) {
    return invalid(
        absl::StrCat("parallel.zero_stage (", parallel.zero_stage(), ") must be 0, 1, 2 or 3"));
  }
  // Megatron-style tensor parallelism splits attention by heads and dense FFNs by
  // columns, so each must divide evenly.
  const int32_t tp = parallel.tensor_parallel_size();
  const ModelConfig& model = recipe.model();
  if (model.num_heads() % tp != 0) {
    return invalid(absl::StrCat("model.num_heads (", model.num_heads(),
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  }
  if (effective_kv_heads(model) % tp != 0) {
    return invalid(absl::StrCat("model.num_kv_heads (", effective_kv_heads(model),
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  }
  if (has_dense_layer(recipe) && model.ffn_hidden_size() % tp != 0) {
    return invalid(absl::StrCat("model.ffn_hidden_size (", model.ffn_hidden_size(),
                                ") must be divisible by parallel.tensor_parallel_size (", tp, ")"));
  }
  if (tp > 1 && recipe.moe().gating() == EXPERT_CHOICE) {
    return invalid(absl::StrCat("parallel.tensor_parallel_size (", tp,
                                ") must be 1 with moe.gating EXPERT_CHOICE: its experts choose "
                                "among a whole micro-batch, which tensor parallelism splits"));
  }
  const int32_t ep = parallel.expert_parallel_size();
  if (effective_moe_layer_interval(recipe) > 0 && recipe.moe().num_experts() % ep != 0) {
    return invalid(absl::StrCat("moe.num_experts (", recipe.moe().num_experts(),
                                ") must be divisible by parallel.expert_parallel_size (", ep, ")"));
  }
  SY_RETURN_IF_ERROR(validate_expert_placement(recipe));
  return validate_pipeline(recipe);
}

// optimizer.muon (filled in): only with algorithm MUON.
absl::Status validate_muon(const OptimizerConfig& optimizer) {
  if (optimizer.algorithm() != MUON) {
    if (optimizer.has_muon())
      return invalid("optimizer.muon is set but optimizer.algorithm is ADAMW: set "
                     "optimizer.algorithm=MUON, or leave optimizer.muon out");
    return absl::OkStatus();
  }
  const MuonConfig& muon = optimizer.muon();
  SY_RETURN_IF_ERROR(check_unit_interval("optimizer.muon.momentum", muon.momentum()));
  SY_RETURN_IF_ERROR(check_positive("optimizer.muon.ns_steps", muon.ns_steps()));
  SY_RETURN_IF_ERROR(check_at_most("optimizer.muon.ns_steps", muon.ns_steps(), kMaxNewtonSchulz));
  for (const auto& [path, value] : {std::pair{"optimizer.muon.ns_a", muon.ns_a()},
                                    std::pair{"optimizer.muon.ns_b", muon.ns_b()},
                                    std::pair{"optimizer.muon.ns_c", muon.ns_c()}}) {
    if (!finite(value)) return invalid(absl::StrCat(path, " (", value, ") must be finite"));
  }
  SY_RETURN_IF_ERROR(check_positive("optimizer.muon.update_rms", muon.update_rms()));
  SY_RETURN_IF_ERROR(
      check_at_most("optimizer.muon.update_rms", muon.update_rms(), kMaxMuonUpdateRms));
  return check_positive("optimizer.muon.eps", muon.eps());
}

absl::Status validate_optimizer(const Recipe& recipe) {
  const OptimizerConfig& optimizer = recipe.optimizer();
  SY_RETURN_IF_ERROR(check_positive("optimizer.lr", optimizer.lr()));
  SY_RETURN_IF_ERROR(check_non_negative("optimizer.min_lr", optimizer.min_lr()));
  if (optimizer.min_lr() > optimizer.lr()) {
    return invalid(absl::StrCat("optimizer.min_lr (", optimizer.min_lr(),
                                ") must be <= optimizer.lr (", optimizer.lr(), ")"));
  }
  SY_RETURN_IF_ERROR(check_unit_interval("optimizer.beta1", optimizer.beta1()));
  SY_RETURN_IF_ERROR(check_unit_interval("optimizer.beta2", optimizer.beta2()));
  SY_RETURN_IF_ERROR(check_positive("optimizer.eps", optimizer.eps()));
  SY_RETURN_IF_ERROR(check_non_negative("optimizer.weight_decay", optimizer.weight_decay()));
  SY_RETURN_IF_ERROR(check_non_negative("optimizer.warmup_steps", optimizer.warmup_steps()));
  if (optimizer.warmup_steps() > recipe.train().steps()) {
    return invalid(absl::StrCat("optimizer.warmup_steps (", optimizer.warmup_steps(),
                                ") must be <= train.steps (", recipe.train().steps(), ")"));
  }
  if (optimizer.decay() == LR_DECAY_UNSPECIFIED) return invalid("optimizer.decay must be set");
  SY_RETURN_IF_ERROR(check_non_negative("optimizer.grad_clip", optimizer.grad_clip()));
  SY_RETURN_IF_ERROR(check_non_negative("optimizer.router_lr_scale", optimizer.router_lr_scale()));
  SY_RETURN_IF_ERROR(check_at_most("optimizer.router_lr_scale", optimizer.router_lr_scale(),
                                   kMaxRouterLrScale));
  if (!OptimizerAlgorithm_IsValid(optimizer.algorithm()))
    return invalid(absl::StrCat("optimizer.algorithm (", static_cast<int>(optimizer.algorithm()),
                                ") must be ADAMW or MUON"));
  return validate_muon(optimizer);
}

absl::Status validate_recompute(const Recipe& recipe) {
  const TrainConfig& train = recipe.train();
  if (!Recompute_IsValid(train.recompute()))
    return invalid(absl::StrCat("train.recompute (", static_cast<int>(train.recompute()),
                                ") must be NONE, SELECTIVE or FULL"));
  SY_RETURN_IF_ERROR(check_non_negative("train.recompute_layers", train.recompute_layers()));
  SY_RETURN_IF_ERROR(check_at_most("train.recompute_layers", train.recompute_layers(),
                                   recipe.model().num_layers()));
  if (train.recompute_layers() != 0 && train.recompute() != FULL)
    return invalid("train.recompute_layers needs train.recompute FULL");
  return absl::OkStatus();
}

absl::Status validate_train(const Recipe& recipe) {
  const TrainConfig& train = recipe.train();
  SY_RETURN_IF_ERROR(check_positive("train.global_batch_size", train.global_batch_size()));
  SY_RETURN_IF_ERROR(
      check_at_most("train.global_batch_size", train.global_batch_size(), kMaxBatchSize));
  SY_RETURN_IF_ERROR(check_positive("train.micro_batch_size", train.micro_batch_size()));
  if (train.global_batch_size() % train.micro_batch_size() != 0) {
    return invalid(absl::StrCat("train.global_batch_size (", train.global_batch_size(),
                                ") must be divisible by train.micro_batch_size (",
                                train.micro_batch_size(), ")"));
  }
  const int64_t micro_batches = train.global_batch_size() / train.micro_batch_size();
  if (recipe.runtime().batch_invariant() && micro_batches > kExactGradMaxParts)
    return invalid(absl::StrCat("runtime.batch_invariant sums the gradients of at most ",
                                kExactGradMaxParts, " micro-batches a step; ",
                                "train.global_batch_size / train.micro_batch_size is ",
                                micro_batches));
  SY_RETURN_IF_ERROR(check_positive("train.seq_len", train.seq_len()));
  const int64_t max_positions = recipe.model().max_position_embeddings();
  SY_RETURN_IF_ERROR(check_positive("model.max_position_embeddings", max_positions));
  SY_RETURN_IF_ERROR(
      check_at_most("model.max_position_embeddings", max_positions, kMaxTokensPerSequence));
  if (train.seq_len() > max_positions) {
    return invalid(absl::StrCat("train.seq_len (", train.seq_len(),
                                ") must be <= model.max_position_embeddings (", max_positions,
                                ")"));
  }
  SY_RETURN_IF_ERROR(check_non_negative("train.steps", train.steps()));
  // The windows and tokens a run draws, counted as it goes.
  SY_RETURN_IF_ERROR(checked_product({{"train.steps", train.steps()},
                                      {"train.global_batch_size", train.global_batch_size()},
                                      {"train.seq_len", train.seq_len()}},
                                     0, std::numeric_limits<int64_t>::max())
                         .status());
  SY_RETURN_IF_ERROR(check_positive("train.log_interval", train.log_interval()));
  SY_RETURN_IF_ERROR(check_non_negative("train.eval_interval", train.eval_interval()));
  if (train.eval_batches() != 0)
    return invalid(absl::StrCat(
        "train.eval_batches (", train.eval_batches(),
        ") is replaced by train.eval_tokens (validation tokens per evaluation): set only "
        "train.eval_tokens"));
  SY_RETURN_IF_ERROR(check_positive("train.eval_tokens", train.eval_tokens()));
  SY_RETURN_IF_ERROR(check_at_most("train.eval_tokens", train.eval_tokens(), kMaxEvalTokens));
  for (const std::string& pattern : train.freeze())
    if (pattern.empty()) return invalid("train.freeze entries must not be empty");
  return validate_recompute(recipe);
}

// A source name goes into metric keys and TensorBoard tags as it is.
bool is_source_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxSourceNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

absl::Status validate_sources(const DataConfig& data) {
  if (!data.dataset().empty() || !data.corpus().empty())
    return invalid("data.sources excludes data.dataset and data.corpus: name each in a source");
  if (data.sources_size() > kMaxDataSources)
    return invalid(absl::StrCat("data.sources has ", data.sources_size(), " entries, more than ",
                                kMaxDataSources));
  std::set<std::string> names;
  double weights = 0;
  for (int i = 0; i < data.sources_size(); ++i) {
    const DataSource& source = data.sources(i);
    const std::string field = absl::StrCat("data.sources[", i, "]");
    if (!is_source_name(source.name()))
      return invalid(absl::StrCat(field, ".name must be 1 to ", kMaxSourceNameBytes,
                                  " letters, digits, '_', '-' or '.'"));
    if (!names.insert(source.name()).second)
      return invalid(absl::StrCat(field, ".name \"", source.name(), "\" names two sources"));
    if (source.dataset().empty() == source.corpus().empty())
      return invalid(absl::StrCat(field, " (", source.name(),
                                  "): exactly one of dataset and corpus must be set"));
    if (!(source.weight() > 0) || !std::isfinite(source.weight()))
      return invalid(absl::StrCat(field, ".weight (", source.weight(),
                                  ") must be positive and finite"));
    weights += source.weight();
  }
  if (!std::isfinite(weights))
    return invalid(absl::StrCat("data.sources weights sum to ", weights,
                                ": they must have a finite sum (they are normalised by it)"));
  return absl::OkStatus();
}

// Whether the recipe trains a tokenizer or tokenises a plain-text corpus.
bool has_corpus(const DataConfig& data) {
  return !data.corpus().empty() ||
         std::any_of(data.sources().begin(), data.sources().end(),
                     [](const DataSource& s) { return !s.corpus().empty(); });
}

absl::Status validate_data(const Recipe& recipe) {
  const DataConfig& data = recipe.data();
  if (data.sources_size() > 0) SY_RETURN_IF_ERROR(validate_sources(data));
  else if (data.corpus().empty() == data.dataset().empty())
    return invalid(
        "exactly one of data.dataset and data.corpus must be set (or data.sources, a blend)");
  if (has_corpus(data) && recipe.model().vocab_size() < kMinCorpusVocabSize) {
    return invalid(absl::StrCat("model.vocab_size (", recipe.model().vocab_size(), ") must be >= ",
                                kMinCorpusVocabSize,
                                " to train a tokenizer on data.corpus (256 byte pieces, "
                                "special tokens and merges)"));
  }
  SY_RETURN_IF_ERROR(check_unit_interval("data.val_fraction", data.val_fraction()));
  if (has_corpus(data) && recipe.train().eval_interval() > 0 && data.val_fraction() == 0) {
    return invalid(absl::StrCat("train.eval_interval (", recipe.train().eval_interval(),
                                ") needs data.val_fraction > 0 (nothing is held out)"));
  }
  return absl::OkStatus();
}

absl::Status validate_checkpoint_and_runtime(const Recipe& recipe) {
  const CheckpointConfig& checkpoint = recipe.checkpoint();
  if (checkpoint.dir().empty()) return invalid("checkpoint.dir must not be empty");
  SY_RETURN_IF_ERROR(check_non_negative("checkpoint.interval_steps", checkpoint.interval_steps()));
  SY_RETURN_IF_ERROR(check_non_negative("checkpoint.keep", checkpoint.keep()));
  const RuntimeConfig& runtime = recipe.runtime();
  if (!runtime.device().empty() && runtime.device() != "cpu" && runtime.device() != "cuda") {
    return invalid(absl::StrCat("runtime.device (\"", runtime.device(),
                                "\") must be \"cpu\", \"cuda\" or empty (pick automatically)"));
  }
  SY_RETURN_IF_ERROR(check_non_negative("runtime.threads", runtime.threads()));
  SY_RETURN_IF_ERROR(check_at_most("runtime.threads", runtime.threads(), kMaxThreads));
  SY_RETURN_IF_ERROR(check_non_negative("runtime.max_logits_mb", runtime.max_logits_mb()));
  if (!runtime.precision().empty() && runtime.precision() != "fp32" &&
      runtime.precision() != "bf16") {
    return invalid(absl::StrCat("runtime.precision (\"", runtime.precision(),
                                "\") must be \"fp32\" or \"bf16\""));
  }
  return absl::OkStatus();
}

bool is_number(const pb::FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return true;
    default:
      return false;
  }
}

// A number field's value, read by core/runtime/numbers.h within its type's range (the
// validation checks each field's own bounds after); a refusal is the whole message
// ("train.seed: -1 must be a non-negative integer").
absl::Status set_number(pb::Message& message, const pb::FieldDescriptor& field,
                        absl::string_view path, absl::string_view value) {
  using Limits32 = std::numeric_limits<int32_t>;
  using Limits64 = std::numeric_limits<int64_t>;
  const pb::Reflection& reflection = *message.GetReflection();
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      SY_ASSIGN_OR_RETURN(const int64_t v,
                          parse_int64(value, path, Limits32::min(), Limits32::max()));
      reflection.SetInt32(&message, &field, static_cast<int32_t>(v));
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      SY_ASSIGN_OR_RETURN(const int64_t v,
                          parse_int64(value, path, Limits64::min(), Limits64::max()));
      reflection.SetInt64(&message, &field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      SY_ASSIGN_OR_RETURN(const uint64_t v,
                          parse_uint64(value, path, std::numeric_limits<uint32_t>::max()));
      reflection.SetUInt32(&message, &field, static_cast<uint32_t>(v));
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      SY_ASSIGN_OR_RETURN(const uint64_t v, parse_uint64(value, path));
      reflection.SetUInt64(&message, &field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const double most = std::numeric_limits<float>::max();
      SY_ASSIGN_OR_RETURN(const double v, parse_double(value, path, {-most, most}));
      reflection.SetFloat(&message, &field, static_cast<float>(v));
      return absl::OkStatus();
    }
    default: {  // CPPTYPE_DOUBLE: is_number allows no other
      const double most = std::numeric_limits<double>::max();
      SY_ASSIGN_OR_RETURN(const double v, parse_double(value, path, {-most, most}));
      reflection.SetDouble(&message, &field, v);
      return absl::OkStatus();
    }
  }
}

// Any other scalar: a bool, an enum by name, a string verbatim.
absl::Status set_scalar(pb::Message& message, const pb::FieldDescriptor& field,
                        absl::string_view path, absl::string_view value) {
  const pb::Reflection& reflection = *message.GetReflection();
  const absl::string_view trimmed = absl::StripAsciiWhitespace(value);
  auto wrong_type = [&](absl::string_view type, absl::string_view hint = "") {
    return invalid(absl::StrCat("\"", value, "\" is not a valid ", type, " for ", path, hint));
  };
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      bool v;
      if (!absl::SimpleAtob(trimmed, &v)) return wrong_type("bool (true or false)");
      reflection.SetBool(&message, &field, v);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor& type = *field.enum_type();
      const pb::EnumValueDescriptor* v = type.FindValueByName(std::string(trimmed));
      if (v == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < type.value_count(); ++i) names.push_back(type.value(i)->name());
        return wrong_type(type.name(), absl::StrCat(" (one of ", absl::StrJoin(names, ", "), ")"));
      }
      reflection.SetEnum(&message, &field, v);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING:
      // Verbatim: a path may legitimately start or end with spaces.
      reflection.SetString(&message, &field, std::string(value));
      break;
    default:  // CPPTYPE_MESSAGE: numbers go to set_number
      return invalid(absl::StrCat(path,
                                  " is a message, not a scalar field; set one of its fields (",
                                  field_names(*field.message_type()), ")"));
  }
  return absl::OkStatus();
}

// A recipe that sets only the deprecated train.eval_batches evaluates the windows it
// evaluated: eval_batches x micro_batch_size of them. One that sets neither gets
// kDefaultEvalTokens. Values the conversion cannot take (not positive, or a product past
// kMaxEvalTokens) stay for validation to refuse.
void fill_eval_tokens(TrainConfig& train) {
  if (train.eval_tokens() != 0) return;
  const int64_t batches = train.eval_batches();
  if (batches == 0) {
    train.set_eval_tokens(kDefaultEvalTokens);
    return;
  }
  if (batches < 0 || train.micro_batch_size() <= 0 || train.seq_len() <= 0 ||
      train.micro_batch_size() > kMaxBatchSize || train.seq_len() > kMaxTokensPerSequence)
    return;
  const int64_t batch_tokens = train.micro_batch_size() * train.seq_len();
  if (batches > kMaxEvalTokens / batch_tokens) return;
  train.set_eval_tokens(batches * batch_tokens);
  train.clear_eval_batches();
}

void fill_routing_defaults(MoeConfig& moe) {
  if (moe.num_experts() > 0) {
    if (moe.gating() == GATING_UNSPECIFIED) moe.set_gating(TOP_K);
    if (moe.score_function() == SCORE_FUNCTION_UNSPECIFIED) moe.set_score_function(SOFTMAX);
    moe.set_renormalize(effective_renormalize(moe));
  }
  if (moe.score_function() == SIGMOID) {
    if (moe.routed_scaling_factor() == 0) moe.set_routed_scaling_factor(1.0f);
    if (moe.num_groups() == 0) moe.set_num_groups(1);
    if (moe.top_groups() == 0) moe.set_top_groups(moe.num_groups());
  }
}

}  // namespace

bool effective_renormalize(const MoeConfig& moe) {
  if (moe.has_renormalize()) return moe.renormalize();
  // Each gating's meaning before the renormalisation was a setting of its own: Mixtral's
  // renormalised softmax top-k, transformers' norm_topk_prob false for sigmoid scores.
  const bool top_k = moe.gating() == TOP_K || moe.gating() == GATING_UNSPECIFIED;
  return moe.gating() == GSHARD_TOP2 || (top_k && moe.score_function() != SIGMOID);
}

int32_t effective_kv_heads(const ModelConfig& model) {
  return model.num_kv_heads() > 0 ? model.num_kv_heads() : model.num_heads();
}

int32_t effective_head_dim(const ModelConfig& model) {
  if (model.head_dim() > 0) return model.head_dim();
  if (model.num_heads() <= 0) return 0;
  return static_cast<int32_t>(model.hidden_size() / model.num_heads());
}

float effective_mtp_loss_coef(const ModelConfig& model) {
  return model.has_mtp_loss_coef() ? model.mtp_loss_coef() : 0.3f;
}

int32_t effective_pipeline_size(const ParallelConfig& parallel) {
  return parallel.pipeline_parallel_size() > 0 ? parallel.pipeline_parallel_size() : 1;
}

int32_t effective_virtual_pipeline_size(const ParallelConfig& parallel) {
  return parallel.virtual_pipeline_size() > 0 ? parallel.virtual_pipeline_size() : 1;
}

PipelineSchedule effective_pipeline_schedule(const ParallelConfig& parallel) {
  if (parallel.pipeline_schedule() != PIPELINE_SCHEDULE_UNSPECIFIED)
    return parallel.pipeline_schedule();
  return effective_virtual_pipeline_size(parallel) > 1 ? INTERLEAVED_1F1B : ONE_F_ONE_B;
}

std::vector<int> pipeline_chunk_layers(const Recipe& recipe) {
  const ParallelConfig& parallel = recipe.parallel();
  if (!parallel.pipeline_layers().empty())
    return {parallel.pipeline_layers().begin(), parallel.pipeline_layers().end()};
  const int chunks = effective_pipeline_size(parallel) * effective_virtual_pipeline_size(parallel);
  // The embedding and the head as a layer each of the end chunks, when asked.
  const int ends = parallel.pipeline_ends_as_layers() && chunks > 1 ? 1 : 0;
  const int slots = recipe.model().num_layers() + 2 * ends;
  std::vector<int> split(static_cast<size_t>(chunks), slots / chunks);
  for (int i = 0; i < slots % chunks; ++i) ++split[i];
  split.front() -= ends;
  split.back() -= ends;
  return split;
}

bool recomputes_layer(const TrainConfig& train, int index_in_chunk) {
  return train.recompute() == FULL &&
         (train.recompute_layers() == 0 || index_in_chunk < train.recompute_layers());
}

bool is_moe_layer(const Recipe& recipe, int layer) {
  const int32_t interval = effective_moe_layer_interval(recipe);
  return interval > 0 && layer >= recipe.model().first_dense_layers() &&
         (layer + 1) % interval == 0;
}

void upgrade_legacy_routing(MoeConfig& moe) {
  bool norm_topk_prob = false;
  pb::UnknownFieldSet& unknown = *moe.GetReflection()->MutableUnknownFields(&moe);
  for (int i = 0; i < unknown.field_count(); ++i)
    if (unknown.field(i).number() == kLegacyNormTopkProb &&
        unknown.field(i).type() == pb::UnknownField::TYPE_VARINT)
      norm_topk_prob = unknown.field(i).varint() != 0;
  unknown.DeleteByNumber(kLegacyNormTopkProb);
  for (const LegacyGating& legacy : kLegacyGatings) {
    if (moe.gating() != legacy.number) continue;
    moe.set_gating(TOP_K);
    moe.set_score_function(legacy.score_function);
    moe.set_renormalize(legacy.renormalize.value_or(norm_topk_prob));
  }
  fill_routing_defaults(moe);
}

namespace {

void fill_muon_defaults(MuonConfig& muon) {
  if (!muon.has_momentum()) muon.set_momentum(0.95f);
  if (!muon.has_nesterov()) muon.set_nesterov(true);
  if (muon.ns_steps() == 0) muon.set_ns_steps(5);
  if (!muon.has_ns_a()) muon.set_ns_a(3.4445f);
  if (!muon.has_ns_b()) muon.set_ns_b(-4.7750f);
  if (!muon.has_ns_c()) muon.set_ns_c(2.0315f);
  if (!muon.has_update_rms()) muon.set_update_rms(0.2f);
  if (muon.eps() == 0) muon.set_eps(1e-7f);
}

}  // namespace

void fill_defaults(Recipe& recipe) {
  ModelConfig& model = *recipe.mutable_model();
  if (model.num_kv_heads() == 0) model.set_num_kv_heads(model.num_heads());
  // Left at 0 when hidden_size does not split evenly, so validation can say so.
  if (model.head_dim() == 0 && model.num_heads() > 0 &&
      model.hidden_size() % model.num_heads() == 0) {
    model.set_head_dim(static_cast<int32_t>(model.hidden_size() / model.num_heads()));
  }
  if (model.rope_theta() == 0) model.set_rope_theta(10000.0f);
  if (model.norm_eps() == 0) model.set_norm_eps(1e-5f);
  if (model.init_std() == 0) model.set_init_std(0.02f);
  if (!model.has_moe_layer_interval()) {
    model.set_moe_layer_interval(effective_moe_layer_interval(recipe));
  }
  if (model.max_position_embeddings() == 0) {
    model.set_max_position_embeddings(recipe.train().seq_len());
  }
  if (model.rope_scaling().type() == YARN) {
    RopeScaling& scaling = *model.mutable_rope_scaling();
    if (scaling.beta_fast() == 0) scaling.set_beta_fast(32.0f);
    if (scaling.beta_slow() == 0) scaling.set_beta_slow(1.0f);
  }

  fill_routing_defaults(*recipe.mutable_moe());

  ParallelConfig& parallel = *recipe.mutable_parallel();
  if (parallel.tensor_parallel_size() == 0) parallel.set_tensor_parallel_size(1);
  if (parallel.expert_parallel_size() == 0) parallel.set_expert_parallel_size(1);

  OptimizerConfig& optimizer = *recipe.mutable_optimizer();
  if (!optimizer.has_beta1()) optimizer.set_beta1(0.9f);
  if (!optimizer.has_beta2()) optimizer.set_beta2(0.95f);
  if (optimizer.eps() == 0) optimizer.set_eps(1e-8f);
  if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(0.1f);
  if (optimizer.decay() == LR_DECAY_UNSPECIFIED) optimizer.set_decay(COSINE);
  if (optimizer.algorithm() == MUON) fill_muon_defaults(*optimizer.mutable_muon());

  TrainConfig& train = *recipe.mutable_train();
  if (train.micro_batch_size() == 0) train.set_micro_batch_size(train.global_batch_size());
  if (train.log_interval() == 0) train.set_log_interval(10);
  fill_eval_tokens(train);

  DataConfig& data = *recipe.mutable_data();
  if (!data.has_val_fraction() && has_corpus(data)) data.set_val_fraction(0.1f);

  CheckpointConfig& checkpoint = *recipe.mutable_checkpoint();
  if (checkpoint.dir().empty()) checkpoint.set_dir("checkpoints");
  if (!checkpoint.has_keep()) checkpoint.set_keep(3);
}

absl::StatusOr<Recipe> parse_recipe(std::string_view text, std::string_view source_name) {
  SY_ASSIGN_OR_RETURN(Recipe recipe, parse_without_defaults(to_absl(text), to_absl(source_name)));
  fill_defaults(recipe);
  return recipe;
}

absl::Status apply_override(Recipe& recipe, std::string_view assignment_view) {
  const absl::string_view assignment = to_absl(assignment_view);
  const size_t equals = assignment.find('=');
  const absl::string_view path = equals == absl::string_view::npos
                                     ? ""
                                     : absl::StripAsciiWhitespace(assignment.substr(0, equals));
  if (path.empty()) {
    return invalid(absl::StrCat("override \"", assignment,
                                "\" must have the form field.path=value (e.g. train.steps=200)"));
  }
  const absl::string_view value = assignment.substr(equals + 1);
  auto error = [&](absl::string_view message) {
    return invalid(absl::StrCat("override \"", assignment, "\": ", message));
  };
  if (const std::string legacy =
          legacy_routing_refusal(path, absl::StripAsciiWhitespace(value));
      !legacy.empty())
    return error(legacy);

  pb::Message* message = &recipe;
  const std::vector<absl::string_view> names = absl::StrSplit(path, '.');
  for (size_t i = 0; i < names.size(); ++i) {
    const pb::Descriptor& descriptor = *message->GetDescriptor();
    const pb::FieldDescriptor* field = descriptor.FindFieldByName(std::string(names[i]));
    const std::string prefix = absl::StrJoin(names.begin(), names.begin() + i + 1, ".");
    if (field == nullptr) {
      return error(absl::StrCat("unknown field path \"", path, "\": ", descriptor.full_name(),
                                " has no field \"", names[i],
                                "\" (valid fields: ", field_names(descriptor), ")"));
    }
    if (field->is_repeated()) {
      const bool strings = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING;
      if (i + 1 != names.size() ||
          (!strings && field->cpp_type() != pb::FieldDescriptor::CPPTYPE_INT32))
        return error(absl::StrCat(prefix, " is not a scalar field"));
      // A list of strings or integers, comma-separated, replaces the recipe's.
      const pb::Reflection& reflection = *message->GetReflection();
      reflection.ClearField(message, field);
      const std::vector<absl::string_view> items = absl::StrSplit(value, ',', absl::SkipEmpty());
      for (size_t k = 0; k < items.size(); ++k) {
        if (strings) {
          reflection.AddString(message, field, std::string(absl::StripAsciiWhitespace(items[k])));
          continue;
        }
        // Spaces around the commas are the list's; the numbers themselves have none.
        const absl::string_view item = absl::StripAsciiWhitespace(items[k]);
        using Limits = std::numeric_limits<int32_t>;
        SY_ASSIGN_OR_RETURN(
            const int64_t number,
            parse_int64(item, absl::StrCat(prefix, "[", k, "]"), Limits::min(), Limits::max()));
        reflection.AddInt32(message, field, static_cast<int32_t>(number));
      }
      break;
    }
    if (i + 1 == names.size() && is_number(*field))
      return set_number(*message, *field, prefix, value);
    if (i + 1 == names.size()) {
      absl::Status status = set_scalar(*message, *field, prefix, value);
      if (!status.ok()) return error(status.message());
      break;
    }
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      return error(
          absl::StrCat(prefix, " is a scalar field and has no field \"", names[i + 1], "\""));
    }
    message = message->GetReflection()->MutableMessage(message, field);
  }
  return absl::OkStatus();
}

absl::Status validate_recipe(const Recipe& recipe) {
  SY_RETURN_IF_ERROR(validate_model(recipe));
  SY_RETURN_IF_ERROR(validate_moe(recipe));
  SY_RETURN_IF_ERROR(validate_parallel(recipe));
  SY_RETURN_IF_ERROR(validate_train(recipe));
  SY_RETURN_IF_ERROR(validate_optimizer(recipe));
  SY_RETURN_IF_ERROR(validate_data(recipe));
  SY_RETURN_IF_ERROR(validate_checkpoint_and_runtime(recipe));
  return absl::OkStatus();
}

std::string fit_schedule_to_steps(Recipe& recipe) {
  const int64_t steps = recipe.train().steps();
  const int64_t warmup = recipe.optimizer().warmup_steps();
  const int64_t eval_interval = recipe.train().eval_interval();
  const int64_t checkpoint_interval = recipe.checkpoint().interval_steps();
  if (steps < 0 || warmup < 0 || eval_interval < 0 || checkpoint_interval < 0) return "";
  std::vector<std::string> changes;
  if (warmup > steps) {
    recipe.mutable_optimizer()->set_warmup_steps(steps);
    changes.push_back(
        absl::StrCat("optimizer.warmup_steps (", warmup, ") is clamped to ", steps));
  }
  if (eval_interval > steps)
    changes.push_back(absl::StrCat("train.eval_interval (", eval_interval,
                                   ") means one evaluation, at step ", steps));
  if (checkpoint_interval > steps)
    changes.push_back(absl::StrCat("checkpoint.interval_steps (", checkpoint_interval,
                                   ") means one checkpoint, at step ", steps));
  if (changes.empty()) return "";
  return absl::StrCat("warning: train.steps (", steps,
                      ") is shorter than the recipe's schedule: ", absl::StrJoin(changes, "; "));
}

namespace {

// The recipe of `text` read from `path`, as load_recipe describes.
absl::StatusOr<Recipe> recipe_from_text(const std::string& text, const std::string& path,
                                        const std::vector<std::string>& overrides,
                                        std::string* quick_run_warning) {
  SY_ASSIGN_OR_RETURN(Recipe recipe, parse_without_defaults(text, path));
  // Data paths written in the file are relative to the file; overrides given on the
  // command line are taken as they are (relative to the working directory).
  auto relative_to_file = [&](const std::string& p) {
    if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
    return (std::filesystem::path(path).parent_path() / p).lexically_normal().string();
  };
  recipe.mutable_data()->set_corpus(relative_to_file(recipe.data().corpus()));
  recipe.mutable_data()->set_dataset(relative_to_file(recipe.data().dataset()));
  for (DataSource& source : *recipe.mutable_data()->mutable_sources()) {
    source.set_corpus(relative_to_file(source.corpus()));
    source.set_dataset(relative_to_file(source.dataset()));
  }
  recipe.mutable_train()->set_init_from(relative_to_file(recipe.train().init_from()));
  for (const std::string& assignment : overrides) {
    SY_RETURN_IF_ERROR(apply_override(recipe, assignment));
  }
  if (recipe.name().empty()) recipe.set_name(std::filesystem::path(path).stem().string());
  fill_defaults(recipe);
  if (quick_run_warning) *quick_run_warning = fit_schedule_to_steps(recipe);
  absl::Status status = validate_recipe(recipe);
  if (!status.ok()) return invalid(absl::StrCat(path, ": ", status.message()));
  return recipe;
}

// A `gating: NAME` or `norm_topk_prob: VALUE` line of a saved recipe: the indentation,
// the field and the value.
struct RoutingLine {
  absl::string_view indent, field, value;
};

std::optional<RoutingLine> routing_line(absl::string_view line) {
  const size_t start = line.find_first_not_of(' ');
  if (start == absl::string_view::npos) return std::nullopt;
  for (absl::string_view field : {"gating", "norm_topk_prob"}) {
    const absl::string_view rest = line.substr(start);
    if (absl::StartsWith(rest, absl::StrCat(field, ": ")))
      return RoutingLine{line.substr(0, start), field, rest.substr(field.size() + 2)};
  }
  return std::nullopt;
}

}  // namespace

std::string upgrade_legacy_routing_text(std::string_view text) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(text.data(), text.size()), '\n');
  const LegacyGating* legacy = nullptr;
  for (absl::string_view line : lines) {
    const std::optional<RoutingLine> r = routing_line(line);
    for (const LegacyGating& g : kLegacyGatings)
      if (r && r->field == "gating" && r->value == g.name) legacy = &g;
  }
  if (legacy == nullptr) return std::string(text);
  std::vector<std::string> out;
  for (absl::string_view line : lines) {
    const std::optional<RoutingLine> r = routing_line(line);
    if (!r) {
      out.emplace_back(line);
    } else if (r->field == "gating") {
      out.push_back(absl::StrCat(r->indent, "gating: TOP_K"));
      out.push_back(absl::StrCat(r->indent, "score_function: ",
                                 ScoreFunction_Name(legacy->score_function)));
      if (legacy->renormalize)
        out.push_back(
            absl::StrCat(r->indent, "renormalize: ", *legacy->renormalize ? "true" : "false"));
    } else if (!legacy->renormalize) {  // norm_topk_prob meant something for sigmoid only
      out.push_back(absl::StrCat(r->indent, "renormalize: ", r->value));
    }
  }
  return absl::StrJoin(out, "\n");
}

absl::StatusOr<Recipe> load_recipe(const std::string& path,
                                   const std::vector<std::string>& overrides,
                                   std::string* quick_run_warning) {
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  return recipe_from_text(text, path, overrides, quick_run_warning);
}

absl::StatusOr<Recipe> load_saved_recipe(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  return recipe_from_text(upgrade_legacy_routing_text(text), path, {}, nullptr);
}

std::string summarize_recipe(const Recipe& recipe) {
  const ModelConfig& model = recipe.model();
  const MoeConfig& moe = recipe.moe();
  int moe_layers = 0;
  for (int layer = 0; layer < model.num_layers(); ++layer)
    moe_layers += is_moe_layer(recipe, layer);

  std::string shape = absl::StrFormat(
      "%s: %d layers (%d MoE), hidden %d, heads %d (kv %d, dim %d), vocab %d", recipe.name(),
      model.num_layers(), moe_layers, model.hidden_size(), model.num_heads(),
      effective_kv_heads(model), effective_head_dim(model), model.vocab_size());
  if (moe_layers < model.num_layers()) {
    absl::StrAppendFormat(&shape, ", dense ffn %d", model.ffn_hidden_size());
  }
  if (moe_layers > 0) {
    absl::StrAppendFormat(&shape, ", %d experts top-%d %s %s%s, expert ffn %d",
                          moe.num_experts(), moe.top_k(), Gating_Name(moe.gating()),
                          ScoreFunction_Name(moe.score_function()),
                          moe.renormalize() ? " renormalised" : "", moe.expert_ffn_hidden_size());
    if (moe.num_shared_experts() > 0) {
      absl::StrAppendFormat(&shape, " + %d shared x %d", moe.num_shared_experts(),
                            moe.shared_expert_ffn_hidden_size());
    }
    if (moe.capacity_factor() > 0) {
      absl::StrAppendFormat(&shape, ", capacity %g", moe.capacity_factor());
    } else {
      absl::StrAppend(&shape, ", dropless");
    }
  }

  const TrainConfig& train = recipe.train();
  const OptimizerConfig& optimizer = recipe.optimizer();
  const ParallelConfig& parallel = recipe.parallel();
  const std::string setup = absl::StrFormat(
      "train: %d steps x %d seqs x %d tokens (micro batch %d), lr %g %s to %g after %d warmup, "
      "tp %d ep %d zero %d, device %s, precision %s",
      train.steps(), train.global_batch_size(), train.seq_len(), train.micro_batch_size(),
      optimizer.lr(), LrDecay_Name(optimizer.decay()), optimizer.min_lr(), optimizer.warmup_steps(),
      parallel.tensor_parallel_size(), parallel.expert_parallel_size(), parallel.zero_stage(),
      recipe.runtime().device().empty() ? "auto" : recipe.runtime().device(),
      recipe.runtime().precision().empty() ? "auto" : recipe.runtime().precision());
  return absl::StrCat(shape, "\n", setup);
}

}  // namespace switchyard::config
