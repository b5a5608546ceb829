#include "engine/cli/convert_command.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_import.h"
#include "data/tokenizer.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

// "5GB", "500MB", "1.5GiB" or plain bytes; decimal units as transformers' save_pretrained.
absl::StatusOr<int64_t> parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  double value = 0;
  const std::string unit = absl::AsciiStrToUpper(text.substr(digits));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KIB", 1024.0}, {"MIB", 1024.0 * 1024}, {"GIB", 1024.0 * 1024 * 1024}};
  if (digits > 0 && absl::SimpleAtod(text.substr(0, digits), &value)) {
    for (const auto& [name, scale] : kUnits) {
      if (unit == name && value * scale >= 1) return static_cast<int64_t>(value * scale);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--max-shard-size \"", text, "\" must be a positive size such as 5GB or 500MB"));
}

}  // namespace

ConvertCommand::ConvertCommand(CLI::App& app) {
  convert_ = app.add_subcommand("convert", "convert weights to and from Hugging Face transformers");
  convert_->require_subcommand(1);

  to_hf_ = convert_->add_subcommand(
      "to-hf", "write a weights directory as a transformers model directory (Mixtral or Qwen2-MoE)");
  to_hf_->add_option("weights", in_, "weights directory (<run-dir>/checkpoints/final)")->required();
  to_hf_->add_option("out", out_, "output directory")->required();
  to_hf_->add_option("--dtype", dtype_, "tensor dtype: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  to_hf_->add_option("--max-shard-size", max_shard_size_,
                     "split the weights into shards of at most this size (e.g. 5GB)");

  from_hf_ = convert_->add_subcommand(
      "from-hf", "import a transformers Mixtral, Qwen2-MoE or OLMoE directory as weights");
  from_hf_->add_option("hf_dir", in_, "transformers model directory")->required();
  from_hf_->add_option("out", out_, "output weights directory")->required();
}

bool ConvertCommand::parsed() const { return convert_->parsed(); }

absl::Status ConvertCommand::run() {
  if (to_hf_->parsed()) return run_to_hf();
  return run_from_hf();
}

absl::Status ConvertCommand::run_to_hf() {
  HfExportOptions options;
  options.dtype = dtype_ == "bf16" ? DType::kBF16 : DType::kF32;
  SY_ASSIGN_OR_RETURN(options.max_shard_bytes, parse_size(max_shard_size_));
  // The exported tokenizer files name the engine's special pieces by these ids.
  const std::string tokenizer_path = in_ + "/tokenizer.model";
  if (std::filesystem::exists(tokenizer_path)) {
    SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
    if (tokenizer.special_ids() != kTrainedSpecialIds)
      return absl::FailedPreconditionError(absl::StrCat(
          tokenizer_path, ": special ids differ from unk 0, bos 1, eos 2, pad 3, which the "
          "exported tokenizer_config.json and generation_config.json assume"));
  }
  SY_RETURN_IF_ERROR(export_hf(in_, out_, options));
  std::printf("wrote %s\n", out_.c_str());
  return absl::OkStatus();
}

absl::Status ConvertCommand::run_from_hf() {
  SY_RETURN_IF_ERROR(import_hf(in_, out_));
  std::printf("wrote %s\n", out_.c_str());
  return absl::OkStatus();
}

}  // namespace switchyard
