// A run's training data: the recipe's data.dataset, data.corpus or data.sources blend,
// resolved to dataset directories and opened. A plain dataset or corpus is a blend of one
// unnamed source of weight 1, so the trainer has one path for both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/recipe.pb.h"
#include "data/loader.h"
#include "data/progress.h"
#include "data/token_dataset.h"

namespace switchyard {

// A source resolved to a dataset directory (a corpus prepared into the cache).
struct SourceDir {
  std::string name;  // "" for a recipe without data.sources
  std::string dir;
  double weight = 1;
};

struct SourceDirOptions {
  std::string dataset_cache_dir;  // where corpora are prepared; empty: the default cache
  // The tokenizer of train.init_from's weights, which corpora are tokenised with; empty:
  // the blend's first dataset's, else one trained on the first corpus.
  std::string tokenizer_path;
};

// Prepares every corpus on first use (data/corpus_cache.h), with one tokenizer for the
// whole blend.
absl::StatusOr<std::vector<SourceDir>> resolve_source_dirs(const config::Recipe& recipe,
                                                           const SourceDirOptions& options,
                                                           DataProgressSink& messages);

struct TrainingSource {
  SourceDir where;
  TokenDataset train;
  std::optional<TokenDataset> val;  // when opened for evaluation
};

// Opens each source's train split (and val split when `with_val`: it must hold a window
// of seq_len + 1 tokens). All sources must share the first one's tokenizer, whose
// vocabulary must fit model_vocab_size.
absl::StatusOr<std::vector<TrainingSource>> open_training_sources(
    const std::vector<SourceDir>& dirs, const DatasetOpenOptions& open_options, bool with_val,
    int64_t seq_len, int64_t model_vocab_size);

std::vector<LoaderSource> loader_sources(const std::vector<TrainingSource>& sources);

// The recipe's blend (names and weights) differs from the saved one's.
bool blend_changed(const config::DataConfig& saved, const config::DataConfig& now);

// The line a run prints about its data: the directory and token count, or per source.
std::string describe_training_data(const std::vector<TrainingSource>& sources);

// `switchyard inspect RECIPE`: the recipe's sources as training will draw them (share of
// each batch, windows per step, epochs over train.steps, validation tokens). Datasets are
// opened without hashing their shards (`inspect DIR` checks one in full); a corpus not
// yet prepared is described as such.
absl::StatusOr<std::string> describe_blend(const config::Recipe& recipe);

}  // namespace switchyard
