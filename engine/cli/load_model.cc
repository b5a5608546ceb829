#include "engine/cli/load_model.h"

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/weights.h"
#include "core/runtime/status_macros.h"
#include "data/token_dataset.h"
#include "kernels/threads.h"

namespace switchyard {

namespace {

namespace fs = std::filesystem;

enum class ModelSource { kWeights, kCheckpoint, kHuggingFace, kNone };

ModelSource model_source(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "recipe.textproto", ec)) return ModelSource::kWeights;
  if (fs::exists(fs::path(dir) / "manifest.pb", ec)) return ModelSource::kCheckpoint;
  if (fs::exists(fs::path(dir) / "config.json", ec)) return ModelSource::kHuggingFace;
  return ModelSource::kNone;
}

// The model of `out.recipe` with its parameters allocated on the CPU, to be filled.
absl::Status build_model(const std::string& dir, LoadedModel& out) {
  set_cpu_threads(out.recipe.runtime().threads());
  set_batch_invariant(out.recipe.runtime().batch_invariant());
  out.model = std::make_unique<Transformer>(out.recipe, out.params);
  SY_RETURN_IF_ERROR(check_fits(cpu_device(),
                                static_cast<double>(out.params.allocation_bytes(DType::kF32)),
                                absl::StrCat("the parameters of ", dir)));
  out.params.allocate(cpu_device());
  return absl::OkStatus();
}

// Reads the tokenizer at `path` ("" when the model has none) into `out`; it must fit the
// model's vocabulary.
absl::Status load_tokenizer(const std::string& dir, const std::string& path,
                            TokenizerUse use, LoadedModel& out) {
  if (path.empty()) {
    if (use == TokenizerUse::kOptional) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat(dir, ": the model has no tokenizer.model"));
  }
  out.tokenizer_path = path;
  SY_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::load(path));
  return check_tokenizer_fits(*out.tokenizer, path, out.recipe);
}

absl::Status load_weights_model(const std::string& dir, TokenizerUse use, LoadedModel& out) {
  SY_ASSIGN_OR_RETURN(out.recipe, load_weights_recipe(dir));
  const std::string tokenizer = dir + "/tokenizer.model";
  std::error_code ec;
  const bool absent = !fs::exists(fs::symlink_status(tokenizer, ec));
  SY_RETURN_IF_ERROR(load_tokenizer(
      dir, absent && use == TokenizerUse::kOptional ? "" : tokenizer, use, out));
  SY_RETURN_IF_ERROR(build_model(dir, out));
  return load_weights(dir, out.params);
}

// The recipe a checkpoint records, its paths relative to the checkpoint (as the trainer
// saves those inside the run directory) made usable from here, as load_recipe does for
// a weights directory's recipe file.
config::Recipe checkpoint_recipe(const std::string& dir, const checkpoint::Manifest& manifest) {
  config::Recipe recipe = manifest.recipe();
  auto resolve = [&](const std::string& path) {
    return path.empty() ? path : (fs::path(dir) / path).lexically_normal().string();
  };
  recipe.mutable_data()->set_dataset(resolve(recipe.data().dataset()));
  for (config::DataSource& source : *recipe.mutable_data()->mutable_sources())
    source.set_dataset(resolve(source.dataset()));
  recipe.mutable_train()->set_init_from(resolve(recipe.train().init_from()));
  return recipe;
}

// A checkpoint's tokenizer.model: the one kept with the dataset its recipe trained on,
// a blend's first ("" when the dataset keeps none).
absl::StatusOr<std::string> checkpoint_tokenizer_path(const config::Recipe& recipe) {
  DatasetOpenOptions options;
  options.verify_checksums = false;
  const config::DataConfig& data_config = recipe.data();
  const std::string& dir = data_config.sources_size() > 0 ? data_config.sources(0).dataset()
                                                          : data_config.dataset();
  SY_ASSIGN_OR_RETURN(const TokenDataset data, TokenDataset::open(dir, "train", options));
  return data.tokenizer_path();
}

absl::Status load_checkpoint_model(const std::string& dir, TokenizerUse use, LoadedModel& out) {
  SY_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, read_manifest(dir));
  out.recipe = checkpoint_recipe(dir, manifest);
  SY_ASSIGN_OR_RETURN(const std::string tokenizer, checkpoint_tokenizer_path(out.recipe));
  SY_RETURN_IF_ERROR(load_tokenizer(dir, tokenizer, use, out));
  SY_RETURN_IF_ERROR(build_model(dir, out));
  std::vector<RowsToRead> reads;
  for (Param& p : out.params.params()) reads.push_back({"param/" + p.name, 0, p.value});
  SY_RETURN_IF_ERROR(read_rows(dir, manifest, reads));
  for (const Param& p : out.params.params())
    SY_RETURN_IF_ERROR(check_finite(p.value, absl::StrCat(dir, "/manifest.pb"), p.name));
  return absl::OkStatus();
}

absl::Status load_hf_model(const std::string& dir, TokenizerUse use, LoadedModel& out) {
  SY_ASSIGN_OR_RETURN(HfModel hf, read_hf_model(dir));
  out.recipe = hf.recipe;
  SY_RETURN_IF_ERROR(load_tokenizer(dir, hf.tokenizer_path, use, out));
  SY_RETURN_IF_ERROR(build_model(dir, out));
  std::map<std::string, Tensor> tensors(std::make_move_iterator(hf.tensors.begin()),
                                        std::make_move_iterator(hf.tensors.end()));
  for (Param& p : out.params.params()) {
    const auto it = tensors.find(p.name);
    if (it == tensors.end() || it->second.shape() != p.shape ||
        it->second.dtype() != DType::kF32)
      return absl::DataLossError(absl::StrCat(dir, ": the import has no f32 tensor ", p.name,
                                              shape_string(p.shape)));
    p.value.copy_from(it->second);
    tensors.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace

bool is_model_directory(const std::string& dir) {
  return model_source(dir) != ModelSource::kNone;
}

absl::Status load_model(const std::string& dir, LoadedModel& out, TokenizerUse tokenizer_use) {
  switch (model_source(dir)) {
    case ModelSource::kWeights:
      return load_weights_model(dir, tokenizer_use, out);
    case ModelSource::kCheckpoint:
      return load_checkpoint_model(dir, tokenizer_use, out);
    case ModelSource::kHuggingFace:
      return load_hf_model(dir, tokenizer_use, out);
    case ModelSource::kNone:
      break;
  }
  return absl::NotFoundError(absl::StrCat(
      dir, ": not a weights directory, a checkpoint or a Hugging Face directory (no "
           "recipe.textproto, manifest.pb or config.json)"));
}

}  // namespace switchyard
