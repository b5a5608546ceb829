// One split ("train" or "val") of a prepared token dataset directory, read as a single
// token stream: the split's shards in index order, concatenated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard {

// The target id of a token that carries no loss (a prompt token of instruction data).
inline constexpr int32_t kIgnoredTarget = -1;

struct DatasetOpenOptions {
  // Hash every shard against the index's sha256 (a full read of the split), so that no
  // damaged byte is trained on. Without it, opening still checks each shard's size,
  // structure and attributes against the index.
  bool verify_checksums = true;
  // Skip the hash of a shard whose unchanged version matched before, and remember new
  // matches (data/checksum_verdicts.h, in default_verdict_cache_dir()).
  bool remember_verdicts = true;
  // When set, the dataset must have been made with this tokenizer / vocabulary size.
  std::string expected_tokenizer_sha256;
  int64_t expected_vocab_size = 0;
  // Keep where the split's documents start (8 bytes per document), for
  // window_document_starts().
  bool with_documents = false;
  // One window per document, padded, instead of packed windows (data.packing PAD; see
  // read_window). Keeps the documents as with_documents does.
  bool pad_documents = false;
};

class TokenDataset {
 public:
  // Errors name the directory, the index or the shard at fault. Shard and tokenizer
  // names from the index must be regular files inside `dir`; the tokenizer kept there
  // must be the one the index names, with the index's vocabulary size.
  static absl::StatusOr<TokenDataset> open(const std::string& dir, std::string_view split,
                                           const DatasetOpenOptions& options = {});

  const std::string& dir() const { return dir_; }
  const std::string& split() const { return split_; }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& tokenizer_sha256() const { return tokenizer_sha256_; }
  const SpecialTokenIds& special_ids() const { return special_ids_; }
  // The tokenizer model kept in the directory, or "" when there is none.
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  int64_t num_tokens() const { return shard_starts_.back(); }
  int64_t num_documents() const { return num_documents_; }
  const std::vector<std::shared_ptr<const ShardReader>>& shards() const { return shards_; }

  // Tokens [start, start + count) of the split's stream, across shard boundaries.
  // Thread-safe.
  absl::Status read_tokens(int64_t start, int64_t count, int32_t* out) const;

  // Loss mask entries [start, start + count) of the split's stream (1 where a shard has
  // no /loss_mask). Thread-safe.
  absl::Status read_loss_mask(int64_t start, int64_t count, uint8_t* out) const;
  // Whether any shard of the split has a /loss_mask (instruction data).
  bool has_loss_mask() const { return has_loss_mask_; }

  // Packed windows: window w covers tokens [w * seq_len, w * seq_len + seq_len + 1);
  // ids are its first seq_len tokens and targets its last seq_len, so every token after
  // the first is a target exactly once. Windows may cross document and shard boundaries.
  // Padded windows (pad_documents): window w is document w; ids are its first seq_len
  // tokens and targets the ones after them, then pad_id() ids and kIgnoredTarget targets
  // to the window's end. A document longer than seq_len + 1 tokens loses its tail.
  int64_t num_windows(int64_t seq_len) const {
    if (pad_documents_) return num_documents_;
    return num_tokens() > 0 ? (num_tokens() - 1) / seq_len : 0;
  }
  // Fills ids and targets (seq_len each) with window `window`. A target whose loss mask
  // entry is 0 becomes kIgnoredTarget: the cross-entropy skips it. Thread-safe.
  absl::Status read_window(int64_t window, int64_t seq_len, int32_t* ids, int32_t* targets) const;
  // The id of padded windows' pad positions: the tokenizer's pad, else its eos, else 0.
  int32_t pad_id() const;
  bool pads_documents() const { return pad_documents_; }
  // The positions of window `window` that hold its text, from the first: the rest are
  // padding (pad_documents), which the MoE router leaves out. seq_len for packed windows.
  int64_t window_tokens(int64_t window, int64_t seq_len) const;
  // Document-aware attention: fills starts (seq_len entries) with, for each position of
  // window `window`, the window position where its document starts (0 for the document
  // the window begins inside). The dataset must be opened with_documents. Thread-safe.
  void window_document_starts(int64_t window, int64_t seq_len, int32_t* starts) const;
  bool has_documents() const { return with_documents_; }

 private:
  // Calls visit(shard, first token in it, count) for the pieces of [start, start + count).
  // read_window() of a padded window, and of a packed one.
  absl::Status read_padded_window(int64_t window, int64_t seq_len, int32_t* ids,
                                  int32_t* targets) const;
  absl::Status read_packed_window(int64_t window, int64_t seq_len, int32_t* ids,
                                  int32_t* targets) const;
  // Marks the targets whose loss mask entries (the stream's from `first`) are 0.
  absl::Status mask_targets(int64_t first, int64_t count, int32_t* targets) const;
  absl::Status for_each_shard_range(
      int64_t start, int64_t count,
      const std::function<absl::Status(const ShardReader&, int64_t, int64_t)>& visit) const;

  std::string dir_;
  std::string split_;
  int64_t vocab_size_ = 0;
  std::string tokenizer_sha256_;
  SpecialTokenIds special_ids_;
  std::string tokenizer_path_;
  int64_t num_documents_ = 0;
  bool has_loss_mask_ = false;
  std::vector<std::shared_ptr<const ShardReader>> shards_;
  std::vector<int64_t> shard_starts_ = {0};  // shards + 1 entries
  // With documents: the stream position where each document starts, non-decreasing (an
  // empty document repeats its successor's start).
  std::vector<int64_t> document_starts_;
  bool with_documents_ = false;
  bool pad_documents_ = false;
};

}  // namespace switchyard
