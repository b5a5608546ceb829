// A text corpus turned into a token dataset on first use and cached, so that a recipe
// can name a plain text file (the tiny recipe names data/corpus/tinyshakespeare.txt).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "data/progress.h"

namespace switchyard {

struct CorpusDatasetOptions {
  int64_t vocab_size = 0;  // of the BPE tokenizer trained on the corpus; at least kMinTokenizerVocabSize
  // A SentencePiece model to tokenise with instead of training one (fine-tuning keeps the
  // weights' own tokenizer); vocab_size is then ignored.
  std::string tokenizer_path;
  double val_fraction = 0.1;
  std::string cache_dir;  // empty: default_dataset_cache_dir()
};

// $SWITCHYARD_CACHE_DIR/datasets, else $XDG_CACHE_HOME/switchyard/datasets, else
// $HOME/.cache/switchyard/datasets.
std::string default_dataset_cache_dir();

// Returns the dataset directory for (corpus bytes, vocab_size or the given tokenizer's
// bytes, val_fraction, format version): <cache_dir>/<corpus name>-v<vocab>-<hash>. When
// it does not exist yet, trains a tokenizer on the corpus (or takes the given one) and
// prepares the dataset into a temporary directory that is
// renamed into place when complete, so concurrent or interrupted runs never see half a
// dataset.
absl::StatusOr<std::string> ensure_prepared_corpus(const std::string& corpus_path,
                                                   const CorpusDatasetOptions& options,
                                                   DataProgressSink& sink);

}  // namespace switchyard
