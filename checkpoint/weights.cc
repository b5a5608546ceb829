#include "checkpoint/weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "engine/config/recipe.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

absl::Status save_weights(const std::string& dir, const config::Recipe& recipe,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& tokenizer_path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  SY_RETURN_IF_ERROR(write_safetensors(dir + "/model.safetensors", tensors));
  if (!tokenizer_path.empty()) {
    const std::string dest = dir + "/tokenizer.model";
    fs::copy_file(tokenizer_path, dest + ".tmp", fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(dest + ".tmp", dest, ec);
    if (ec) return absl::DataLossError(absl::StrCat(dest, ": cannot copy the tokenizer: ", ec.message()));
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(recipe, &text);
  const std::string recipe_path = dir + "/recipe.textproto";
  {
    std::ofstream out(recipe_path + ".tmp", std::ios::trunc);
    out << text;
    if (!out) return absl::DataLossError(absl::StrCat(recipe_path, ": write failed"));
  }
  fs::rename(recipe_path + ".tmp", recipe_path, ec);
  if (ec) return absl::DataLossError(absl::StrCat(recipe_path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<config::Recipe> load_weights_recipe(const std::string& dir) {
  const std::string path = dir + "/recipe.textproto";
  if (!fs::exists(path))
    return absl::NotFoundError(absl::StrCat(dir, ": not a weights directory (no recipe.textproto)"));
  return config::load_recipe(path, {});
}

absl::Status load_weights(const std::string& dir, ParamStore& params) {
  SY_ASSIGN_OR_RETURN(auto tensors, read_safetensors(dir + "/model.safetensors"));
  for (Param& p : params.params()) {
    auto it = tensors.find(p.name);
    if (it == tensors.end())
      return absl::DataLossError(absl::StrCat(dir, "/model.safetensors: missing tensor ", p.name));
    if (it->second.shape() != p.shape || it->second.dtype() != DType::kF32)
      return absl::DataLossError(absl::StrCat(dir, "/model.safetensors: tensor ", p.name, " is ",
                                              dtype_name(it->second.dtype()),
                                              shape_string(it->second.shape()), ", expected f32",
                                              shape_string(p.shape)));
    p.value.copy_from(it->second);
    tensors.erase(it);
  }
  if (!tensors.empty())
    return absl::DataLossError(absl::StrCat(dir, "/model.safetensors: unexpected tensor ",
                                            tensors.begin()->first));
  return absl::OkStatus();
}

}  // namespace switchyard
