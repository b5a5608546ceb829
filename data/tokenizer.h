// SentencePiece tokenizers: training (`switchyard data tokenizer`), encoding and decoding.
//
// Models trained here use BPE or unigram with byte fallback, no normalization and no
// dummy prefix, so decode(encode(x)) == x for any bytes, and fixed Llama-like special ids:
//   unk = 0 "<unk>", bos = 1 "<s>", eos = 2 "</s>", pad = 3 "<pad>",
// then the 256 byte pieces "<0x00>".."<0xFF>" (ids 4..259), then learned pieces.
// Any other SentencePiece model can be loaded too; its own special ids are reported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/config/vocab_limit.h"
#include "data/progress.h"

namespace switchyard {

namespace spm {
class Model;
}

// -1 marks a token the model does not have.
struct SpecialTokenIds {
  int64_t unk = -1;
  int64_t bos = -1;
  int64_t eos = -1;
  int64_t pad = -1;
  bool operator==(const SpecialTokenIds&) const = default;
};

inline constexpr SpecialTokenIds kTrainedSpecialIds = {0, 1, 2, 3};

// The special and byte pieces alone take 260; below this there is no room for merges.
inline constexpr int64_t kMinTokenizerVocabSize = 300;

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // text / JSON Lines files, see data/document_reader.h
  int64_t vocab_size = 0;
  std::string model_type = "bpe";  // "bpe" or "unigram"
  std::string text_field = "text";
  int threads = 0;  // 0: every core
  // Lines (SentencePiece "sentences") sampled for training when the input has more.
  int64_t max_sentences = 2'000'000;
  uint32_t seed = 1;
};

// Trains a model on every line of the inputs' documents and writes it to out_path
// (atomically: a temporary file renamed when complete).
absl::Status train_tokenizer(const TokenizerTrainOptions& options, const std::string& out_path,
                             DataProgressSink& sink);

class Tokenizer {
 public:
  static absl::StatusOr<Tokenizer> load(const std::string& path);
  // `name` stands for the source in error messages. Models over kMaxMetadataFileBytes or
  // kMaxVocabSize pieces are refused; so is anything SentencePiece cannot parse.
  static absl::StatusOr<Tokenizer> from_bytes(std::string model_bytes, const std::string& name);

  int64_t vocab_size() const;
  SpecialTokenIds special_ids() const;
  // sha256 of the model file: the name shards record for their tokenizer.
  const std::string& sha256() const { return sha256_; }
  const std::string& model_bytes() const { return *model_bytes_; }

  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>* ids) const;
  // Control tokens (bos, eos, pad) decode to nothing.
  absl::StatusOr<std::string> decode(absl::Span<const int32_t> ids) const;

 private:
  std::shared_ptr<const spm::Model> model_;
  std::shared_ptr<const std::string> model_bytes_;
  std::string sha256_;
};

}  // namespace switchyard
