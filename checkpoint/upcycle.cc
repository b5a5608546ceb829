#include "checkpoint/upcycle.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/config/recipe.h"
#include "core/runtime/rng.h"
#include "core/runtime/status_macros.h"

namespace switchyard {
namespace {

constexpr char kDenseGateUp[] = "mlp.gate_up_proj.weight";  // (2, F, H)
constexpr char kDenseDown[] = "mlp.down_proj.weight";       // (H, F)
// Bounds every option before it reaches an int32 recipe field; validate_recipe applies
// the engine's own, smaller limits after.
constexpr int64_t kMaxOption = 1 << 20;

absl::Status check_options(const UpcycleOptions& o, int64_t ffn) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"--experts", o.experts}, {"--top-k", o.top_k}, {"--granularity", o.granularity}};
  for (const auto& [name, value] : sizes) {
    if (value < 1 || value > kMaxOption)
      return absl::InvalidArgumentError(
          absl::StrCat(name, " (", value, ") must be in [1, ", kMaxOption, "]"));
  }
  const int64_t g = o.granularity;
  if (ffn % g != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "--granularity (", g, ") must divide the dense FFN's intermediate_size (", ffn, ")"));
  if (o.experts % g != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--experts (", o.experts, ") must be a multiple of --granularity (", g, ")"));
  if (o.top_k % g != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k (", o.top_k, ") must be a multiple of --granularity (", g,
                     "): the chosen experts must be whole copies of the FFN"));
  if (o.top_k > o.experts)
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k (", o.top_k, ") must be at most --experts (", o.experts, ")"));
  return absl::OkStatus();
}

// The dense recipe made the MoE one: every layer MoE, E experts of width F / G.
absl::StatusOr<config::Recipe> moe_recipe(const config::Recipe& dense, const UpcycleOptions& o) {
  config::Recipe recipe = dense;
  config::ModelConfig& model = *recipe.mutable_model();
  config::MoeConfig& moe = *recipe.mutable_moe();
  moe.set_expert_ffn_hidden_size(model.ffn_hidden_size() / o.granularity);
  model.clear_ffn_hidden_size();
  model.set_moe_layer_interval(1);
  model.set_first_dense_layers(0);
  moe.set_num_experts(static_cast<int32_t>(o.experts));
  moe.set_top_k(static_cast<int32_t>(o.top_k));
  moe.set_gating(config::TOP_K);
  moe.set_score_function(config::SOFTMAX);
  moe.set_renormalize(true);
  moe.set_aux_loss_coef(0.01f);
  const absl::Status valid = config::validate_recipe(recipe);
  if (!valid.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("the upcycled model is not a valid recipe: ", valid.message()));
  return recipe;
}

// The router (E, H): row c * G + g is row c of a random (E / G, H) matrix.
Tensor router(const UpcycleOptions& o, int64_t hidden, float std, uint64_t layer) {
  const int64_t copies = o.experts / o.granularity;
  Tensor out = Tensor::empty({o.experts, hidden}, DType::kF32);
  Rng rng = Rng(o.seed).fork(layer);
  for (int64_t c = 0; c < copies; ++c) {
    float* first = out.data<float>() + c * o.granularity * hidden;
    for (int64_t i = 0; i < hidden; ++i) first[i] = static_cast<float>(std * rng.normal());
    for (int64_t g = 1; g < o.granularity; ++g)
      std::memcpy(first + g * hidden, first, hidden * sizeof(float));
  }
  return out;
}

// The experts' gate_up_proj (E, 2I, H): expert c * G + g holds rows [g I, (g + 1) I) of
// the dense gate and up matrices.
Tensor expert_gate_up(const Tensor& dense, int64_t experts, int64_t granularity) {
  const int64_t F = dense.shape()[1], H = dense.shape()[2], I = F / granularity;
  Tensor out = Tensor::empty({experts, 2 * I, H}, DType::kF32);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t g = e % granularity;
    for (int64_t half = 0; half < 2; ++half)
      std::memcpy(out.data<float>() + (2 * e + half) * I * H,
                  dense.data<float>() + (half * F + g * I) * H, I * H * sizeof(float));
  }
  return out;
}

// The experts' down_proj (E, H, I): expert c * G + g holds columns [g I, (g + 1) I) of
// the dense down matrix, times G.
Tensor expert_down(const Tensor& dense, int64_t experts, int64_t granularity) {
  const int64_t H = dense.shape()[0], F = dense.shape()[1], I = F / granularity;
  const float scale = static_cast<float>(granularity);
  Tensor out = Tensor::empty({experts, H, I}, DType::kF32);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t g = e % granularity;
    for (int64_t row = 0; row < H; ++row) {
      const float* src = dense.data<float>() + row * F + g * I;
      float* dst = out.data<float>() + (e * H + row) * I;
      for (int64_t i = 0; i < I; ++i) dst[i] = scale * src[i];
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<HfModel> upcycle(const HfModel& dense, const UpcycleOptions& options) {
  const config::ModelConfig& model = dense.recipe.model();
  SY_RETURN_IF_ERROR(check_options(options, model.ffn_hidden_size()));
  HfModel out;
  SY_ASSIGN_OR_RETURN(out.recipe, moe_recipe(dense.recipe, options));
  out.tokenizer_path = dense.tokenizer_path;
  uint64_t layer = 0;
  for (const auto& [name, tensor] : dense.tensors) {
    if (absl::EndsWith(name, kDenseGateUp)) {
      const std::string mlp = name.substr(0, name.size() - std::strlen(kDenseGateUp)) + "mlp.";
      out.tensors.emplace_back(mlp + "gate.weight",
                               router(options, model.hidden_size(), model.init_std(), layer++));
      out.tensors.emplace_back(mlp + "experts.gate_up_proj",
                               expert_gate_up(tensor, options.experts, options.granularity));
    } else if (absl::EndsWith(name, kDenseDown)) {
      const std::string mlp = name.substr(0, name.size() - std::strlen(kDenseDown)) + "mlp.";
      out.tensors.emplace_back(mlp + "experts.down_proj",
                               expert_down(tensor, options.experts, options.granularity));
    } else {
      out.tensors.emplace_back(name, tensor);
    }
  }
  return out;
}

}  // namespace switchyard
