#include "checkpoint/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

absl::Status save_weights(const std::string& dir, const config::Recipe& recipe,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& tokenizer_path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  SY_RETURN_IF_ERROR(write_safetensors(dir + "/model.safetensors", tensors));
  if (!tokenizer_path.empty())
    SY_RETURN_IF_ERROR(copy_file_atomically(tokenizer_path, dir + "/tokenizer.model"));
  std::string text;
  google::protobuf::TextFormat::PrintToString(recipe, &text);
  return write_file_atomically(dir + "/recipe.textproto", text);
}

absl::StatusOr<config::Recipe> load_weights_recipe(const std::string& dir) {
  const std::string path = dir + "/recipe.textproto";
  if (!fs::exists(path))
    return absl::NotFoundError(absl::StrCat(dir, ": not a weights directory (no recipe.textproto)"));
  return config::load_saved_recipe(path);
}

bool is_weights_file(std::string_view name) {
  if (name.ends_with(".partial")) name.remove_suffix(std::strlen(".partial"));
  return name == "recipe.textproto" || name == "model.safetensors" || name == "tokenizer.model";
}

absl::Status load_weights(const std::string& dir, ParamStore& params) {
  const std::string path = dir + "/model.safetensors";
  SY_ASSIGN_OR_RETURN(auto tensors, read_safetensors(path));
  for (Param& p : params.params()) {
    auto it = tensors.find(p.name);
    if (it == tensors.end())
      return absl::DataLossError(absl::StrCat(path, ": missing tensor ", p.name));
    if (it->second.shape() != p.shape || it->second.dtype() != DType::kF32)
      return absl::DataLossError(absl::StrCat(path, ": tensor ", p.name, " is ",
                                              dtype_name(it->second.dtype()),
                                              shape_string(it->second.shape()), ", expected f32",
                                              shape_string(p.shape)));
    SY_RETURN_IF_ERROR(check_finite(it->second, path, p.name));
    p.value.copy_from(it->second);
    tensors.erase(it);
  }
  if (!tensors.empty())
    return absl::DataLossError(absl::StrCat(path, ": unexpected tensor ", tensors.begin()->first));
  return absl::OkStatus();
}

absl::Status read_weight_rows(const std::string& dir, const std::vector<RowsToRead>& reads) {
  SY_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(dir + "/model.safetensors"));
  constexpr std::string_view kPrefix = "param/";
  for (const RowsToRead& read : reads) {
    SY_CHECK_MSG(read.key.rfind(kPrefix, 0) == 0, "weights hold parameter values only");
    const std::string name = read.key.substr(kPrefix.size());
    const SafetensorsEntry* entry = file.find(name);
    if (entry == nullptr)
      return absl::DataLossError(absl::StrCat(file.path(), ": missing tensor ", name));
    const Shape& whole = entry->shape;
    const int64_t rows = read.out.rows();
    const bool fits =
        entry->dtype == DType::kF32 && whole.size() == read.out.shape().size() && !whole.empty() &&
        std::equal(whole.begin() + 1, whole.end(), read.out.shape().begin() + 1) &&
        read.first_row >= 0 && read.first_row + rows <= whole[0];
    if (!fits)
      return absl::DataLossError(absl::StrCat(
          file.path(), ": tensor ", name, " is ", dtype_name(entry->dtype), shape_string(whole),
          ", expected f32 with rows [", read.first_row, ", ", read.first_row + rows, ") of ",
          shape_string(read.out.shape())));
    Tensor host = read.out.device().type() == DeviceType::kCpu
                      ? read.out
                      : Tensor::empty(read.out.shape(), DType::kF32);
    SY_RETURN_IF_ERROR(file.read_rows(*entry, read.first_row, host));
    SY_RETURN_IF_ERROR(check_finite(host, file.path(), name));
    if (host.raw_data() != read.out.raw_data())
      read.out.device().copy_from_host(read.out.raw_data(), host.raw_data(), host.nbytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer> load_weights_tokenizer(const std::string& dir,
                                                 const config::Recipe& recipe) {
  const std::string path = dir + "/tokenizer.model";
  SY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(path));
  SY_RETURN_IF_ERROR(check_tokenizer_fits(tokenizer, path, recipe));
  return tokenizer;
}

absl::Status check_finite(const Tensor& t, const std::string& file, const std::string& name) {
  const float* values = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(values[i]))
      return absl::DataLossError(absl::StrCat(file, ": tensor ", name, " holds ",
                                              std::isnan(values[i]) ? "NaN" : "infinity",
                                              " at element ", i));
  }
  return absl::OkStatus();
}

absl::Status check_tokenizer_fits(const Tokenizer& tokenizer, const std::string& path,
                                  const config::Recipe& recipe) {
  if (tokenizer.vocab_size() > recipe.model().vocab_size())
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the tokenizer's ", tokenizer.vocab_size(),
        " pieces do not fit the model's model.vocab_size of ", recipe.model().vocab_size()));
  return absl::OkStatus();
}

}  // namespace switchyard
