#include "data/corpus_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/dataset_index.h"
#include "data/prepare.h"
#include "data/sha256.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard {

namespace fs = std::filesystem;

std::string default_dataset_cache_dir() {
  if (const char* dir = std::getenv("SWITCHYARD_CACHE_DIR"); dir && *dir)
    return (fs::path(dir) / "datasets").string();
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir)
    return (fs::path(dir) / "switchyard" / "datasets").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".cache" / "switchyard" / "datasets").string();
}

absl::StatusOr<std::string> ensure_prepared_corpus(const std::string& corpus_path,
                                                   const CorpusDatasetOptions& options,
                                                   DataProgressSink& sink) {
  // The user's own corpus: as large as the file is (it is hashed whole for the cache key).
  SY_ASSIGN_OR_RETURN(const std::string corpus,
                      read_file(corpus_path, std::numeric_limits<int64_t>::max()));
  if (corpus.empty())
    return absl::InvalidArgumentError(absl::StrCat(corpus_path, ": the corpus is empty"));
  const std::string cache_dir =
      options.cache_dir.empty() ? default_dataset_cache_dir() : options.cache_dir;
  std::optional<Tokenizer> given;
  if (!options.tokenizer_path.empty()) {
    SY_ASSIGN_OR_RETURN(given, Tokenizer::load(options.tokenizer_path));
  }
  const int64_t vocab = given ? given->vocab_size() : options.vocab_size;
  const std::string tokenizer_key = given ? given->sha256() : "bpe";
  const std::string key =
      sha256_hex(absl::StrFormat("%s|vocab=%d|val=%.17g|%s|format=%d", sha256_hex(corpus), vocab,
                                 options.val_fraction, tokenizer_key, kTokenFormatVersion));
  const fs::path dir =
      fs::path(cache_dir) /
      absl::StrCat(fs::path(corpus_path).stem().string(), "-v", vocab, "-", key.substr(0, 16));
  std::error_code ec;
  if (fs::exists(dir / kIndexFileName, ec)) return dir.string();

  fs::create_directories(cache_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat(cache_dir, ": cannot create the cache directory"));
  const fs::path temp = fs::path(dir.string() + absl::StrCat(".tmp-", getpid()));
  fs::remove_all(temp, ec);
  fs::create_directories(temp, ec);
  auto prepare = [&]() -> absl::Status {
    sink.on_message(absl::StrCat("preparing ", corpus_path, " into ", dir.string(),
                                 " (first use; cached afterwards)"));
    const std::string model = (temp / "tokenizer.model").string();
    if (given) {
      SY_RETURN_IF_ERROR(copy_file_atomically(options.tokenizer_path, model));
    } else {
      TokenizerTrainOptions tokenizer;
      tokenizer.inputs = {corpus_path};
      tokenizer.vocab_size = options.vocab_size;
      SY_RETURN_IF_ERROR(train_tokenizer(tokenizer, model, sink));
    }
    PrepareOptions prepare;
    prepare.tokenizer_path = model;
    prepare.inputs = {corpus_path};
    prepare.out_dir = temp.string();
    prepare.val_fraction = options.val_fraction;
    return prepare_dataset(prepare, sink).status();
  };
  absl::Status status = prepare();
  if (status.ok()) {
    fs::rename(temp, dir, ec);
    // Another process may have finished the same dataset first; theirs is as good.
    if (ec && fs::exists(dir / kIndexFileName)) ec.clear();
    if (ec)
      status = absl::InternalError(absl::StrCat(
          dir.string(), ": cannot move the prepared dataset into place: ", ec.message()));
  }
  std::error_code ignored;
  fs::remove_all(temp, ignored);
  SY_RETURN_IF_ERROR(status);
  return dir.string();
}

}  // namespace switchyard
