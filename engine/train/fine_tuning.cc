#include "engine/train/fine_tuning.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <map>
#include <vector>
#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/weights.h"
#include "core/runtime/status_macros.h"
#include "engine/optim/optimizer.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// Settings a run started from weights may change: they neither shape nor define the
// model (docs/training.md lists them).
bool may_differ_from_weights(const std::string& field) {
  static const char* const kFields[] = {"model.init_std", "model.max_position_embeddings",
                                        "moe.capacity_factor", "moe.aux_loss_coef",
                                        "moe.z_loss_coef", "moe.aux_loss_per_layer",
                                        "moe.bias_update_rate", "moe.router_force_balance",
                                        "moe.seq_aux_loss_coef", "model.mtp_loss_coef"};
  return std::find(std::begin(kFields), std::end(kFields), field) != std::end(kFields);
}

// The first field of `section` ("model" or "moe") where the recipe and the weights'
// recipe differ, refused naming both values.
absl::Status check_same_model_section(const google::protobuf::Message& mine,
                                      const google::protobuf::Message& weights,
                                      const std::string& section, const std::string& dir) {
  const google::protobuf::Descriptor* descriptor = mine.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string name = absl::StrCat(section, ".", field->name());
    if (may_differ_from_weights(name)) continue;
    std::string ours, theirs;
    google::protobuf::TextFormat::PrintFieldValueToString(mine, field, -1, &ours);
    google::protobuf::TextFormat::PrintFieldValueToString(weights, field, -1, &theirs);
    if (ours != theirs)
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is ", ours, " in the recipe but ", theirs, " in the weights of ", dir,
          " (train.init_from): the recipe must describe the weights' model"));
  }
  return absl::OkStatus();
}

// The groups train.freeze may name, each the parts of parameter names it covers.
const std::map<std::string, std::vector<std::string>>& freeze_groups() {
  static const auto* groups = new std::map<std::string, std::vector<std::string>>{
      {"router", {kRouterNamePart}},
      {"embeddings", {"model.embed_tokens."}},
      {"attention", {".self_attn."}},
      {"experts", {".mlp.experts."}},
      {"shared_experts", {".mlp.shared_expert.", ".mlp.shared_expert_gate."}},
      {"norms", {"layernorm.", "model.norm.", "_norm."}},
      {"lm_head", {"lm_head."}}};
  return *groups;
}

}  // namespace

absl::StatusOr<std::optional<InitWeights>> open_init_weights(const config::Recipe& recipe) {
  if (recipe.train().init_from().empty()) return std::nullopt;
  std::string dir = fs::absolute(recipe.train().init_from()).lexically_normal().string();
  if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  SY_ASSIGN_OR_RETURN(const config::Recipe weights, load_weights_recipe(dir));
  SY_RETURN_IF_ERROR(check_same_model_section(recipe.model(), weights.model(), "model", dir));
  SY_RETURN_IF_ERROR(check_same_model_section(recipe.moe(), weights.moe(), "moe", dir));
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, load_weights_tokenizer(dir, weights));
  return InitWeights{dir, dir + "/tokenizer.model", tokenizer.sha256()};
}

absl::Status apply_freeze(const config::TrainConfig& tc, ParamStore& params,
                          Communicator& pipeline, ProgressSink& sink) {
  std::vector<int64_t> counts = {0, 0};  // frozen, all: elements of the whole tensors
  int64_t& frozen = counts[0];
  for (const Param& p : params.params()) counts[1] += shape_numel(p.whole_shape);
  for (const std::string& entry : tc.freeze()) {
    const auto group = freeze_groups().find(entry);
    const std::vector<std::string> parts =
        group != freeze_groups().end() ? group->second : std::vector<std::string>{entry};
    int64_t matched = 0;
    for (Param& p : params.params()) {
      const bool named = std::any_of(parts.begin(), parts.end(), [&](const std::string& part) {
        return p.name.find(part) != std::string::npos;
      });
      if (!named) continue;
      ++matched;
      if (p.trainable) frozen += shape_numel(p.whole_shape);
      p.trainable = false;
    }
    pipeline.all_reduce_sum(&matched, 1);
    if (matched == 0) {
      std::vector<std::string> names;
      for (const auto& [name, unused] : freeze_groups()) names.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(
          "train.freeze \"", entry, "\" names no parameter (a group: ", absl::StrJoin(names, ", "),
          "; or a part of parameter names, such as model.layers.0.)"));
    }
  }
  pipeline.all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  if (frozen == counts[1])
    return absl::InvalidArgumentError(absl::StrCat(
        "train.freeze (", absl::StrJoin(tc.freeze(), ","),
        ") freezes every parameter: nothing is left to train"));
  if (frozen > 0)
    sink.on_message(absl::StrFormat("frozen by train.freeze: %.3fM of %.3fM parameters",
                                    frozen / 1e6, counts[1] / 1e6));
  return absl::OkStatus();
}

}  // namespace switchyard
