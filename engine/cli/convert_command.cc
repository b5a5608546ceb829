#include "engine/cli/convert_command.h"

#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/upcycle.h"
#include "checkpoint/weights.h"
#include "core/runtime/device.h"
#include "core/runtime/dir_lock.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/param_store.h"
#include "core/runtime/status_macros.h"
#include "engine/cli/load_model.h"
#include "engine/cli/number_flags.h"
#include "engine/model/transformer.h"

namespace switchyard {
namespace {

// Upcycling bounds: as the recipe's, at most 4096 experts, so K and G are no more either.
constexpr int64_t kMaxExperts = 4096;

// The output directory's lock (core/runtime/dir_lock.h) for the command's run, taken once
// the output paths' checks (core/runtime/output_paths.h) allow the directory, so that a
// refused conversion creates nothing, and checked again under the lock: an earlier
// conversion may have filled it meanwhile. `input` names the input directory in messages.
absl::StatusOr<DirLock> lock_output(const InputPath& input, const std::string& out,
                                    bool overwrite) {
  const OutputPath output = output_directory("OUT_DIR", out, {}, /*must_be_empty=*/true);
  SY_RETURN_IF_ERROR(check_outputs({input}, {output}, overwrite));
  std::string warning;
  SY_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(out, &warning));
  if (!warning.empty()) std::printf("%s\n", warning.c_str());
  SY_RETURN_IF_ERROR(check_outputs({input}, {output}, overwrite));
  return lock;
}

// `model` as a weights directory at `out`, written whole (StagedDirectory); an earlier
// conversion's weights files there are replaced, other files kept.
absl::Status write_weights_directory(const HfModel& model, const std::string& out, DirLock& lock) {
  SY_ASSIGN_OR_RETURN(StagedDirectory staged, StagedDirectory::create(out));
  SY_RETURN_IF_ERROR(save_weights(staged.path(), model.recipe, model.tensors, model.tokenizer_path));
  return staged.commit(is_weights_file, lock);
}

}  // namespace

ConvertCommand::ConvertCommand(CLI::App& app) {
  convert_ = app.add_subcommand("convert", "convert weights to and from Hugging Face transformers");
  convert_->require_subcommand(1);

  to_hf_ = convert_->add_subcommand(
      "to-hf", "write weights or a checkpoint as a transformers model directory (Mixtral, Qwen2-MoE, "
      "Qwen3-MoE or OLMoE)");
  to_hf_->add_option("weights", in_,
                     "weights directory (<run-dir>/checkpoints/final) or checkpoint "
                     "(<run-dir>/checkpoints/step_N)")
      ->required();
  to_hf_->add_option("out", out_, "output directory")->required();
  to_hf_->add_option("--dtype", dtype_, "tensor dtype: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  to_hf_
      ->add_option("--max-shard-size", max_shard_size_,
                   "split the weights into shards of at most this size (e.g. 5GB)")
      ->check(size_with_units());
  to_hf_->add_flag("--overwrite", overwrite_,
                   "replace an earlier export's files in a non-empty output directory");

  from_hf_ = convert_->add_subcommand(
      "from-hf", "import a transformers Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE directory as weights");
  from_hf_->add_option("hf_dir", in_, "transformers model directory")->required();
  from_hf_->add_option("out", out_, "output weights directory")->required();
  from_hf_->add_flag("--overwrite", overwrite_,
                     "replace an earlier import's files in a non-empty output directory");

  upcycle_ = convert_->add_subcommand(
      "upcycle", "make a dense transformers Llama, Mistral or Qwen2 directory a mixture of experts "
      "whose first forward equals the dense model's (weights directory)");
  upcycle_->add_option("hf_dir", in_, "dense transformers model directory")->required();
  upcycle_->add_option("out", out_, "output weights directory")->required();
  upcycle_->add_option("--experts", experts_, "number of experts E, a multiple of G")
      ->required()
      ->transform(integer_in(1, kMaxExperts));
  upcycle_->add_option("--top-k", top_k_, "experts per token K, a multiple of G")
      ->required()
      ->transform(integer_in(1, kMaxExperts));
  upcycle_
      ->add_option("--granularity", granularity_,
                   "split the dense FFN into G finer experts (its width / G each)")
      ->transform(integer_in(1, kMaxExperts));
  upcycle_->add_option("--seed", seed_, "seed of the router's random initialisation")
      ->transform(seed_value());
  upcycle_->add_flag("--overwrite", overwrite_,
                     "replace an earlier conversion's files in a non-empty output directory");
}

bool ConvertCommand::parsed() const { return convert_->parsed(); }

absl::Status ConvertCommand::run() {
  if (to_hf_->parsed()) return run_to_hf();
  if (upcycle_->parsed()) return run_upcycle();
  return run_from_hf();
}

absl::Status ConvertCommand::run_to_hf() {
  HfExportOptions options;
  options.dtype = dtype_ == "bf16" ? DType::kBF16 : DType::kF32;
  SY_ASSIGN_OR_RETURN(options.max_shard_bytes,
                      parse_size_with_units(max_shard_size_, "--max-shard-size"));
  SY_ASSIGN_OR_RETURN(DirLock lock, lock_output({"WEIGHTS_DIR", in_}, out_, overwrite_));
  LoadedModel model;
  SY_RETURN_IF_ERROR(load_model(in_, model, TokenizerUse::kOptional));
  SY_ASSIGN_OR_RETURN(const std::string architecture, hf_architecture_for(model.recipe));
  const int mtp_depth = model.recipe.model().mtp_depth();
  if (mtp_depth > 0 && !hf_mtp_modules_exported(architecture))
    std::printf("the %d multi-token prediction module%s left out: %s checkpoints have no "
                "place for them (transformers runs the main model alone)\n",
                mtp_depth, mtp_depth == 1 ? " is" : "s are", architecture.c_str());
  std::map<std::string, Tensor> weights;
  for (const Param& p : model.params.params()) weights.emplace(p.name, p.value);
  SY_ASSIGN_OR_RETURN(StagedDirectory staged, StagedDirectory::create(out_));
  SY_RETURN_IF_ERROR(export_hf(in_, model.tokenizer_path, model.recipe, std::move(weights),
                               staged.path(), options));
  SY_RETURN_IF_ERROR(staged.commit(is_hf_export_file, lock));
  std::printf("wrote %s\n", out_.c_str());
  return absl::OkStatus();
}

absl::Status ConvertCommand::run_from_hf() {
  SY_ASSIGN_OR_RETURN(DirLock lock, lock_output({"HF_DIR", in_}, out_, overwrite_));
  SY_ASSIGN_OR_RETURN(const HfModel model, read_hf_model(in_));
  SY_RETURN_IF_ERROR(write_weights_directory(model, out_, lock));
  std::printf("wrote %s\n", out_.c_str());
  return absl::OkStatus();
}

absl::Status ConvertCommand::run_upcycle() {
  SY_ASSIGN_OR_RETURN(DirLock lock, lock_output({"HF_DIR", in_}, out_, overwrite_));
  SY_ASSIGN_OR_RETURN(const HfModel dense, read_hf_dense_model(in_));
  const UpcycleOptions options{experts_, top_k_, granularity_, seed_};
  SY_ASSIGN_OR_RETURN(const HfModel model, upcycle(dense, options));
  SY_RETURN_IF_ERROR(write_weights_directory(model, out_, lock));
  std::printf("wrote %s\n", out_.c_str());
  return absl::OkStatus();
}

}  // namespace switchyard
