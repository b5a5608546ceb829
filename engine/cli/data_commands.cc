#include "engine/cli/data_commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "core/config/recipe.h"
#include "core/runtime/dir_lock.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "data/inspect.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "engine/cli/inspect_checkpoint.h"
#include "engine/cli/number_flags.h"
#include "engine/cli/progress_line.h"
#include "engine/train/training_data.h"

namespace switchyard {
namespace {

// The bounds of the flags. Threads as the recipe's runtime.threads: a thread per core of
// the largest machines. A shard of 2^40 tokens is 4 TiB; more is one shard of everything.
// A decoded sample is for reading: 2^20 tokens is more than a terminal shows.
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxShardTokens = int64_t{1} << 40;
constexpr int64_t kMaxSampleTokens = int64_t{1} << 20;

// 1234567 -> "1.23M"
std::string human(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2fG", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1e4) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

// The progress of data jobs: a live line with an ETA redrawn on a terminal; a plain line
// every 10 s otherwise (logs).
class TerminalDataProgress : public DataProgressSink {
 public:
  TerminalDataProgress()
      : line_(stdout, isatty(STDOUT_FILENO) == 1, terminal_columns(STDOUT_FILENO)) {}

  void on_progress(const DataProgress& p) override {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!p.finished && since < (line_.live() ? 0.1 : 10.0)) return;
    last_ = now;
    const double s = std::max(p.elapsed_s, 1e-9);
    std::string line =
        absl::StrFormat("%-9s %.1f/%.1f MB", p.stage, p.bytes_done / 1e6, p.bytes_total / 1e6);
    if (p.bytes_total > 0)
      absl::StrAppendFormat(&line, " %3.0f%%", 100.0 * p.bytes_done / p.bytes_total);
    if (p.bytes_total > 0 && p.bytes_done > 0 && !p.finished)
      absl::StrAppend(&line, "  eta ",
                      format_duration(p.elapsed_s * (p.bytes_total - p.bytes_done) / p.bytes_done));
    absl::StrAppendFormat(&line, "  %s docs", human(p.documents));
    if (p.tokens > 0) absl::StrAppendFormat(&line, "  %s tokens", human(p.tokens));
    absl::StrAppendFormat(&line, "  | %.1f MB/s  %s docs/s", p.bytes_done / 1e6 / s,
                          human(p.documents / s));
    if (p.tokens > 0) absl::StrAppendFormat(&line, "  %s tok/s", human(p.tokens / s));
    absl::StrAppendFormat(&line, "  %.1fs", p.elapsed_s);
    line_.update(line);
    if (p.finished) line_.finish();
  }

  void on_message(const std::string& text) override { line_.print(text); }

  // Ends a live line, so that what follows (an error on stderr) starts on its own line.
  void end_line() { line_.finish(); }

 private:
  ProgressLine line_;
  std::chrono::steady_clock::time_point last_{};
};

// "prepared DIR: train ... tokens, ... (... MB/s)"; `what` names the dataset or part.
void print_summary(const std::string& what, const PrepareSummary& s) {
  if (s.shards_resumed > 0)
    std::printf("resumed: %lld shards were complete already\n",
                static_cast<long long>(s.shards_resumed));
  std::printf(
      "prepared %s: train %lld tokens, %lld documents, %lld shards; val %lld tokens, %lld "
      "documents, %lld shards; %.1f MB of text in %.1f s (%.2f MB/s)\n",
      what.c_str(), static_cast<long long>(s.tokens[0]), static_cast<long long>(s.documents[0]),
      static_cast<long long>(s.shards[0]), static_cast<long long>(s.tokens[1]),
      static_cast<long long>(s.documents[1]), static_cast<long long>(s.shards[1]),
      s.input_bytes / 1e6, s.seconds, s.input_bytes / 1e6 / std::max(s.seconds, 1e-9));
}

std::string special_ids_text(const SpecialTokenIds& s) {
  return absl::StrFormat("unk %d, bos %d, eos %d, pad %d", s.unk, s.bos, s.eos, s.pad);
}

// The lock of the dataset directory `dir` (core/runtime/dir_lock.h) for the command's
// run. A part locks itself alone, so that the parts of one dataset run at once while a
// second run of the same part is refused; a whole prepare and merge-parts lock the dataset.
// A merge of parts still running refuses by itself: their records are unfinished.
absl::StatusOr<DirLock> lock_dataset(const std::string& dir, std::optional<PartId> part) {
  const std::string name =
      part ? absl::StrFormat(".switchyard.part-%05d-of-%05d.lock", part->index, part->count)
           : std::string(kDirLockName);
  std::string warning;
  SY_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(dir, &warning, name));
  if (!warning.empty()) std::printf("%s\n", warning.c_str());
  return lock;
}

}  // namespace

DataCommands::DataCommands(CLI::App& app) {
  data_ = app.add_subcommand("data", "tokenizers and token datasets");
  data_->require_subcommand(1);

  tokenizer_ =
      data_->add_subcommand("tokenizer", "train a SentencePiece tokenizer (byte fallback)");
  tokenizer_->add_option("--input", inputs_, "text or JSON Lines files (.gz too)")->required();
  tokenizer_->add_option("--vocab-size", vocab_size_, "pieces in the vocabulary")
      ->required()
      ->transform(integer_in(kMinTokenizerVocabSize, kMaxVocabSize));
  tokenizer_->add_option("--model-type", model_type_, "bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  tokenizer_->add_option("--out", out_, "model file to write (e.g. tok.model)")->required();
  tokenizer_->add_option("--text-field", text_field_, "JSON Lines field holding the text");
  tokenizer_->add_option("--threads", threads_, "training threads; 0 uses every core")
      ->transform(integer_in(0, kMaxThreads));
  tokenizer_->add_flag("--overwrite", overwrite_, "replace an existing tokenizer model at --out");

  prepare_ = data_->add_subcommand("prepare", "tokenize text into HDF5 token shards");
  prepare_->add_option("--tokenizer", tokenizer_path_, "SentencePiece model")->required();
  prepare_->add_option("--input", inputs_, "text or JSON Lines files (.gz too)")->required();
  prepare_->add_option("--out", out_, "dataset directory to create")->required();
  prepare_->add_option("--val-fraction", val_fraction_, "fraction of documents held out")
      ->transform(real_in({0, 1, /*min_open=*/false, /*max_open=*/true}));
  prepare_->add_option("--shard-tokens", shard_tokens_, "tokens per shard (at least)")
      ->transform(integer_in(1, kMaxShardTokens));
  prepare_->add_option("--text-field", text_field_, "JSON Lines field holding the text");
  prepare_->add_option("--threads", threads_, "encoding threads; 0 uses every core")
      ->transform(integer_in(0, kMaxThreads));
  prepare_->add_option("--chat-template", chat_template_,
                       "chat template (JSON, e.g. data/templates/mistral.json): the inputs are "
                       "JSON Lines conversations, trained on the template's loss roles only");
  prepare_->add_option("--part", part_,
                       "I/N: make part I of N (the inputs split by file) and leave the index "
                       "to data merge-parts");

  merge_parts_ = data_->add_subcommand(
      "merge-parts", "check the parts that data prepare --part made and write their dataset's index");
  merge_parts_->add_option("dir", out_, "dataset directory holding every part")->required();

  inspect_ = app.add_subcommand("inspect", "describe and validate a token dataset, a shard or a checkpoint, or describe a recipe's data blend");
  inspect_->add_option("path", inspect_path_, "dataset directory, .h5 shard, checkpoint (step_<N> or checkpoints directory), or recipe (.textproto: its data blend)")->required();
  inspect_->add_option("--tokenizer", tokenizer_path_,
                       "model to decode the sample with (default: the dataset's own)");
  inspect_->add_option("--sample-tokens", sample_tokens_, "tokens of the sample to decode")
      ->transform(integer_in(0, kMaxSampleTokens));
}

bool DataCommands::parsed() const { return data_->parsed() || inspect_->parsed(); }

absl::Status DataCommands::run() {
  if (tokenizer_->parsed()) return run_tokenizer();
  if (prepare_->parsed()) return run_prepare();
  if (merge_parts_->parsed()) return run_merge_parts();
  return run_inspect();
}

absl::Status DataCommands::run_tokenizer() {
  TokenizerTrainOptions options;
  options.inputs = inputs_;
  options.vocab_size = vocab_size_;
  options.model_type = model_type_;
  options.text_field = text_field_;
  options.threads = threads_;
  SY_RETURN_IF_ERROR(check_outputs(
      input_paths({{"--input", inputs_}}),
      {output_file("--out", out_, "tokenizer model",
                   [](const std::string& path) { return Tokenizer::load(path).ok(); })},
      overwrite_));
  TerminalDataProgress progress;
  return train_tokenizer(options, out_, progress);
}

absl::Status DataCommands::run_prepare() {
  PrepareOptions options;
  options.tokenizer_path = tokenizer_path_;
  options.inputs = inputs_;
  options.out_dir = out_;
  options.val_fraction = val_fraction_;
  options.shard_tokens = shard_tokens_;
  options.text_field = text_field_;
  options.threads = threads_;
  options.chat_template = chat_template_;
  if (!part_.empty()) {
    SY_ASSIGN_OR_RETURN(options.part, parse_part_id(part_));
  }
  if (out_.empty()) return absl::InvalidArgumentError("no output directory given");
  SY_RETURN_IF_ERROR(check_outputs(input_paths({{"--tokenizer", {tokenizer_path_}},
                                                {"--input", inputs_},
                                                {"--chat-template", {chat_template_}}}),
                                   {output_directory("--out", out_)}, /*overwrite=*/false));
  SY_ASSIGN_OR_RETURN(const DirLock lock, lock_dataset(out_, options.part));
  TerminalDataProgress progress;
  const absl::StatusOr<PrepareSummary> s = prepare_dataset(options, progress);
  progress.end_line();
  if (!s.ok()) return s.status();
  print_summary(options.part ? absl::StrFormat("part %d/%d of %s", options.part->index,
                                               options.part->count, out_)
                             : out_,
                *s);
  if (options.part)
    std::printf("when every part is prepared: switchyard data merge-parts %s\n", out_.c_str());
  return absl::OkStatus();
}

absl::Status DataCommands::run_merge_parts() {
  SY_RETURN_IF_ERROR(check_outputs({}, {output_directory("DIR", out_)}, /*overwrite=*/false));
  SY_ASSIGN_OR_RETURN(const DirLock lock, lock_dataset(out_, std::nullopt));
  TerminalDataProgress progress;
  const absl::StatusOr<PrepareSummary> s = merge_parts(out_, progress);
  progress.end_line();
  if (!s.ok()) return s.status();
  std::printf("merged %s: train %lld tokens, %lld documents, %lld shards; val %lld tokens, %lld "
              "documents, %lld shards\n",
              out_.c_str(), static_cast<long long>(s->tokens[0]),
              static_cast<long long>(s->documents[0]), static_cast<long long>(s->shards[0]),
              static_cast<long long>(s->tokens[1]), static_cast<long long>(s->documents[1]),
              static_cast<long long>(s->shards[1]));
  return absl::OkStatus();
}

namespace {

// A recipe file, whose data `inspect` describes.
bool is_recipe(const std::string& path) {
  const std::string extension = std::filesystem::path(path).extension().string();
  return extension == ".textproto" || extension == ".pbtxt";
}

}  // namespace

absl::Status DataCommands::run_inspect() {
  if (is_checkpoint(inspect_path_)) return inspect_checkpoint(inspect_path_);
  if (is_recipe(inspect_path_)) {
    SY_ASSIGN_OR_RETURN(const config::Recipe recipe, config::load_recipe(inspect_path_, {}));
    SY_ASSIGN_OR_RETURN(const std::string text, describe_blend(recipe));
    std::fputs(text.c_str(), stdout);
    return absl::OkStatus();
  }
  InspectOptions options;
  options.tokenizer_path = tokenizer_path_;
  options.sample_tokens = sample_tokens_;
  SY_ASSIGN_OR_RETURN(const InspectReport r, inspect_token_data(inspect_path_, options));
  std::printf("%s: %s, format version %lld\n", r.path.c_str(),
              r.is_directory ? "token dataset" : "token shard",
              static_cast<long long>(r.format_version));
  std::printf("  tokenizer sha256 %s, vocab_size %lld, special ids: %s\n",
              r.tokenizer_sha256.c_str(), static_cast<long long>(r.vocab_size),
              special_ids_text(r.special_ids).c_str());
  struct Totals {
    int64_t shards = 0, tokens = 0, documents = 0, bytes = 0;
  };
  std::map<std::string, Totals> totals;
  for (const ShardReport& s : r.shards) {
    std::printf("  %-28s %-5s %-6s %12lld tokens %9lld docs %12lld bytes  max id %lld  %s\n",
                std::filesystem::path(s.path).filename().c_str(), s.split.c_str(),
                token_dtype_name(s.dtype), static_cast<long long>(s.tokens),
                static_cast<long long>(s.documents), static_cast<long long>(s.bytes),
                static_cast<long long>(s.max_token_id),
                s.checksum_checked ? "sha256 ok" : "(no index: checksum not checked)");
    if (s.loss_tokens >= 0)
      std::printf("    loss mask: %lld of %lld tokens carry loss (%.1f%%)\n",
                  static_cast<long long>(s.loss_tokens), static_cast<long long>(s.tokens),
                  s.tokens > 0 ? 100.0 * s.loss_tokens / s.tokens : 0.0);
    Totals& t = totals[s.split];
    ++t.shards;
    t.tokens += s.tokens;
    t.documents += s.documents;
    t.bytes += s.bytes;
  }
  if (r.is_directory)
    for (const auto& [split, t] : totals)
      std::printf("  %s: %lld shards, %lld tokens, %lld documents, %.1f MB\n", split.c_str(),
                  static_cast<long long>(t.shards), static_cast<long long>(t.tokens),
                  static_cast<long long>(t.documents), t.bytes / 1e6);
  std::printf("  valid: structure, document offsets, every token id < %lld%s\n",
              static_cast<long long>(r.vocab_size),
              r.shards.front().checksum_checked ? ", checksums" : "");
  if (!r.sample_tokenizer.empty()) {
    std::printf("  sample (%zu tokens, decoded with %s):\n    %s\n", r.sample_ids.size(),
                r.sample_tokenizer.c_str(), absl::StrReplaceAll(r.sample, {{"\n", "\\n"}}).c_str());
  } else {
    std::string ids;
    for (int32_t id : r.sample_ids) absl::StrAppend(&ids, ids.empty() ? "" : " ", id);
    std::printf("  sample ids (no tokenizer; pass --tokenizer to decode): %s\n", ids.c_str());
  }
  return absl::OkStatus();
}

}  // namespace switchyard
