// One HDF5 token shard (schema in docs/data.md), in the layout of data/hdf5_writer.h:
//   /tokens       1-D uint16 (vocabularies up to 65536) or uint32, contiguous: the stream
//   /doc_offsets  1-D int64, num_documents + 1 entries: 0, the end of each document, ...;
//                 the last equals the length of /tokens
//   /loss_mask    optional, 1-D uint8 as long as /tokens: 1 where the token, as a target,
//                 carries loss, 0 where it does not (a prompt); absent means all 1
//   root attributes: format_version (3), tokenizer_sha256 (a fixed-length string),
//                 vocab_size, unk_id, bos_id, eos_id, pad_id (-1 where the tokenizer has none)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/hdf5_reader.h"
#include "data/tokenizer.h"

namespace switchyard {

inline constexpr int64_t kTokenFormatVersion = 3;
inline constexpr int64_t kUint16VocabLimit = 65536;

enum class TokenDType { kUint16, kUint32 };

TokenDType token_dtype_for_vocab(int64_t vocab_size);
const char* token_dtype_name(TokenDType dtype);

struct ShardAttributes {
  int64_t format_version = kTokenFormatVersion;
  std::string tokenizer_sha256;
  int64_t vocab_size = 0;
  SpecialTokenIds special_ids;
};

// Writes a shard at `path` (the caller picks a temporary name and renames it when
// close() succeeded). Tokens go to an unnamed temporary file beside it as they come, and
// into the shard's contiguous /tokens when close() knows their number.
class ShardWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ShardWriter>> create(const std::string& path,
                                                             const ShardAttributes& attributes);
  ~ShardWriter();

  // Appends one document (its ids, end-of-document token included). Ids must be below
  // the vocabulary size. `loss_mask` (count entries, 0 or 1, or null for all 1): the
  // shard gets a /loss_mask once any document has one.
  absl::Status append_document(const int32_t* ids, int64_t count,
                               const uint8_t* loss_mask = nullptr);
  // Flushes, writes /doc_offsets and the attributes, closes and fsyncs the file.
  absl::Status close();

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return static_cast<int64_t>(doc_offsets_.size()) - 1; }
  TokenDType dtype() const { return dtype_; }
  bool has_loss_mask() const { return mask_fd_ >= 0; }

 private:
  ShardWriter() = default;
  absl::Status flush();
  // Starts the mask's temporary file with a 1 for every token so far.
  absl::Status start_loss_mask();

  std::string path_;
  ShardAttributes attributes_;
  TokenDType dtype_ = TokenDType::kUint16;
  int spill_fd_ = -1;              // the unnamed temporary file of the tokens so far
  std::vector<uint32_t> pending_;  // tokens not yet in it
  int mask_fd_ = -1;               // the loss mask's, once a document has one
  std::vector<uint8_t> pending_mask_;
  std::vector<int64_t> doc_offsets_ = {0};
  int64_t num_tokens_ = 0;
  bool closed_ = false;
};

// Reads a shard through data/hdf5_reader.h (no libhdf5). Opening checks the structure
// (datasets, types, attributes, document offsets) and that every extent lies inside the
// file, before allocating; token values are checked as they are read. Thread-safe.
class ShardReader {
 public:
  static absl::StatusOr<std::shared_ptr<ShardReader>> open(const std::string& path);
  // The same checks on an in-memory image of a shard file; `name` names it in errors.
  static absl::StatusOr<std::shared_ptr<ShardReader>> open_image(std::string_view bytes,
                                                                 const std::string& name);
  ~ShardReader();

  const std::string& path() const { return path_; }
  const ShardAttributes& attributes() const { return attributes_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return num_documents_; }

  // Tokens [start, start + count) as int32. An id at or above the vocabulary size is an
  // error naming the shard and the position.
  absl::Status read_tokens(int64_t start, int64_t count, int32_t* out) const;
  // The whole of /doc_offsets (opening has checked it, in blocks).
  absl::StatusOr<std::vector<int64_t>> read_doc_offsets() const;
  // Largest token id, reading the whole shard (validation; it also catches ids at or
  // above the vocabulary size).
  absl::StatusOr<int64_t> scan_max_token() const;

  bool has_loss_mask() const { return loss_mask_.has_value(); }
  // Loss mask entries [start, start + count) (all 1 without a /loss_mask). An entry other
  // than 0 or 1 is an error naming the shard and the position.
  absl::Status read_loss_mask(int64_t start, int64_t count, uint8_t* out) const;
  // Tokens that carry loss, reading the whole mask (validation).
  absl::StatusOr<int64_t> count_loss_tokens() const;

 private:
  explicit ShardReader(Hdf5File file) : file_(std::move(file)) {}
  static absl::StatusOr<std::shared_ptr<ShardReader>> from_file(Hdf5File file);
  absl::Status read_attributes();
  absl::Status open_tokens();
  absl::StatusOr<Hdf5Dataset> doc_offsets_dataset() const;
  absl::Status check_doc_offsets();
  absl::Status open_loss_mask();

  Hdf5File file_;
  std::string path_;
  ShardAttributes attributes_;
  TokenDType dtype_ = TokenDType::kUint16;
  Hdf5Dataset tokens_;
  std::optional<Hdf5Dataset> loss_mask_;
  int64_t num_tokens_ = 0;
  int64_t num_documents_ = 0;
};

}  // namespace switchyard
