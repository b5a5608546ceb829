#include "engine/train/training_data.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/config/recipe.h"
#include "core/runtime/status_macros.h"
#include "data/corpus_cache.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

absl::Status check_not_placeholder(const std::string& dataset) {
  std::error_code ec;
  if (fs::path(dataset).filename() == config::kPlaceholderDataset && !fs::exists(dataset, ec))
    return absl::InvalidArgumentError(absl::StrCat(
        "data.dataset is the placeholder of a recipe that describes weights only: set "
        "data.dataset=DIR or data.corpus=FILE (and the schedule: train.steps, "
        "train.global_batch_size, train.seq_len, optimizer.lr)"));
  return absl::OkStatus();
}

// The sources as the recipe names them: data.sources, else its one dataset or corpus.
std::vector<config::DataSource> named_sources(const config::DataConfig& data) {
  if (data.sources_size() > 0) return {data.sources().begin(), data.sources().end()};
  config::DataSource one;
  one.set_dataset(data.dataset());
  one.set_corpus(data.corpus());
  one.set_weight(1);
  return {one};
}

// The tokenizer.model a dataset keeps ("" when it keeps none).
absl::StatusOr<std::string> kept_tokenizer(const std::string& dir) {
  DatasetOpenOptions unverified;
  unverified.verify_checksums = false;
  SY_ASSIGN_OR_RETURN(const TokenDataset data, TokenDataset::open(dir, "train", unverified));
  return data.tokenizer_path();
}

}  // namespace

absl::StatusOr<std::vector<SourceDir>> resolve_source_dirs(const config::Recipe& recipe,
                                                           const SourceDirOptions& options,
                                                           DataProgressSink& messages) {
  const std::vector<config::DataSource> sources = named_sources(recipe.data());
  CorpusDatasetOptions corpus_options;
  corpus_options.tokenizer_path = options.tokenizer_path;
  corpus_options.vocab_size = recipe.model().vocab_size();
  corpus_options.val_fraction = recipe.data().val_fraction();
  corpus_options.cache_dir = options.dataset_cache_dir;
  // Corpora take the blend's tokenizer: the weights', else the first dataset's.
  const bool corpora = std::any_of(sources.begin(), sources.end(),
                                   [](const config::DataSource& s) { return !s.corpus().empty(); });
  for (const config::DataSource& source : sources) {
    if (!corpora || !corpus_options.tokenizer_path.empty() || source.dataset().empty()) continue;
    SY_RETURN_IF_ERROR(check_not_placeholder(source.dataset()));
    SY_ASSIGN_OR_RETURN(corpus_options.tokenizer_path, kept_tokenizer(source.dataset()));
    if (corpus_options.tokenizer_path.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          source.dataset(), ": keeps no tokenizer.model, which the blend's corpora need"));
  }
  std::vector<SourceDir> dirs;
  for (const config::DataSource& source : sources) {
    SourceDir where{source.name(), source.dataset(), source.weight()};
    if (source.corpus().empty()) {
      SY_RETURN_IF_ERROR(check_not_placeholder(where.dir));
    } else {
      SY_ASSIGN_OR_RETURN(where.dir,
                          ensure_prepared_corpus(source.corpus(), corpus_options, messages));
      // Without weights or datasets, the first corpus's tokenizer serves the others.
      if (corpus_options.tokenizer_path.empty())
        corpus_options.tokenizer_path = (fs::path(where.dir) / "tokenizer.model").string();
    }
    dirs.push_back(std::move(where));
  }
  return dirs;
}

absl::StatusOr<std::vector<TrainingSource>> open_training_sources(
    const std::vector<SourceDir>& dirs, const DatasetOpenOptions& open_options, bool with_val,
    int64_t seq_len, int64_t model_vocab_size) {
  std::vector<TrainingSource> sources;
  DatasetOpenOptions options = open_options;
  for (const SourceDir& where : dirs) {
    SY_ASSIGN_OR_RETURN(TokenDataset train, TokenDataset::open(where.dir, "train", options));
    if (train.vocab_size() > model_vocab_size)
      return absl::InvalidArgumentError(absl::StrCat(
          where.dir, ": its tokenizer has ", train.vocab_size(),
          " tokens, more than model.vocab_size (", model_vocab_size, ")"));
    // Every later source must be tokenised as the first one is.
    if (options.expected_tokenizer_sha256.empty() && dirs.size() > 1) {
      options.expected_tokenizer_sha256 = train.tokenizer_sha256();
      options.expected_vocab_size = train.vocab_size();
    }
    std::optional<TokenDataset> val;
    if (with_val) {
      SY_ASSIGN_OR_RETURN(val, TokenDataset::open(where.dir, "val", options));
      if (val->num_windows(seq_len) == 0)
        return absl::InvalidArgumentError(absl::StrCat(
            where.dir, ": the validation split is shorter than one window of train.seq_len + 1 (",
            seq_len + 1, ") tokens; set train.eval_interval=0 or hold out more data"));
    }
    sources.push_back({where, std::move(train), std::move(val)});
  }
  return sources;
}

std::vector<LoaderSource> loader_sources(const std::vector<TrainingSource>& sources) {
  std::vector<LoaderSource> out;
  for (const TrainingSource& source : sources) out.push_back({source.train, source.where.weight});
  return out;
}

bool blend_changed(const config::DataConfig& saved, const config::DataConfig& now) {
  if (saved.sources_size() != now.sources_size()) return true;
  for (int i = 0; i < saved.sources_size(); ++i)
    if (saved.sources(i).name() != now.sources(i).name() ||
        saved.sources(i).weight() != now.sources(i).weight())
      return true;
  return false;
}

std::string describe_training_data(const std::vector<TrainingSource>& sources) {
  if (sources.size() == 1 && sources[0].where.name.empty())
    return absl::StrFormat("%s (%lld training tokens)", sources[0].where.dir,
                           static_cast<long long>(sources[0].train.num_tokens()));
  double total = 0;
  for (const TrainingSource& s : sources) total += s.where.weight;
  std::vector<std::string> parts;
  for (const TrainingSource& s : sources)
    parts.push_back(absl::StrFormat("%s %.1f%% of each batch from %s (%lld training tokens)",
                                    s.where.name, 100.0 * s.where.weight / total, s.where.dir,
                                    static_cast<long long>(s.train.num_tokens())));
  return absl::StrCat("blend of ", sources.size(), ": ", absl::StrJoin(parts, "; "));
}

namespace {

// "3.07 epochs" of a source's train split over the run, with the columns before it; its
// windows are documents with data.packing PAD.
std::string describe_dataset_source(const std::string& dir, double windows_per_step,
                                    const config::Recipe& recipe) {
  const config::TrainConfig& train = recipe.train();
  DatasetOpenOptions unverified;
  unverified.verify_checksums = false;
  unverified.pad_documents = recipe.data().packing() == config::PAD;
  absl::StatusOr<TokenDataset> data = TokenDataset::open(dir, "train", unverified);
  if (!data.ok()) return absl::StrCat("cannot open: ", data.status().message());
  const int64_t windows = data->num_windows(train.seq_len());
  std::string text = absl::StrFormat("%lld train tokens, %lld windows",
                                     static_cast<long long>(data->num_tokens()),
                                     static_cast<long long>(windows));
  if (windows > 0)
    absl::StrAppendFormat(&text, ", %.2f epochs over %lld steps",
                          windows_per_step * static_cast<double>(train.steps()) / windows,
                          static_cast<long long>(train.steps()));
  absl::StatusOr<TokenDataset> val = TokenDataset::open(dir, "val", unverified);
  if (val.ok())
    absl::StrAppendFormat(&text, ", %lld validation tokens",
                          static_cast<long long>(val->num_tokens()));
  return text;
}

}  // namespace

absl::StatusOr<std::string> describe_blend(const config::Recipe& recipe) {
  const config::TrainConfig& train = recipe.train();
  std::vector<config::DataSource> sources = named_sources(recipe.data());
  if (recipe.data().sources_size() == 0) sources[0].set_name("data");
  double total = 0;
  for (const config::DataSource& source : sources) total += source.weight();
  std::string text = absl::StrFormat(
      "%s: %zu source%s, seed %llu, %lld windows of %lld tokens per step, %lld steps\n",
      recipe.name(), sources.size(), sources.size() == 1 ? "" : "s",
      static_cast<unsigned long long>(train.seed()),
      static_cast<long long>(train.global_batch_size()), static_cast<long long>(train.seq_len()),
      static_cast<long long>(train.steps()));
  for (const config::DataSource& source : sources) {
    const double share = source.weight() / total;
    const double per_step = share * static_cast<double>(train.global_batch_size());
    absl::StrAppendFormat(&text, "  %s: weight %g, %.1f%% of each batch (%.2f windows per step)\n",
                          source.name(), source.weight(), 100.0 * share, per_step);
    if (source.corpus().empty())
      absl::StrAppendFormat(&text, "    dataset %s: %s\n", source.dataset(),
                            describe_dataset_source(source.dataset(), per_step, recipe));
    else
      absl::StrAppendFormat(&text, "    corpus %s (prepared with the blend's tokenizer on first use)\n",
                            source.corpus());
  }
  return text;
}

}  // namespace switchyard
