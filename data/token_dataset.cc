#include "data/token_dataset.h"

#include <functional>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/runtime/check.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/checksum_verdicts.h"
#include "data/dataset_index.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// The index's tokenizer_file inside `dir`, refused unless it is the tokenizer the index
// names and has the index's vocabulary size.
absl::StatusOr<std::string> checked_tokenizer_path(const std::string& dir,
                                                   const DatasetIndex& index) {
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();
  SY_ASSIGN_OR_RETURN(
      const std::string path,
      path_in_directory(dir, index.tokenizer_file, index_path + ": field tokenizer_file"));
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(path));
  if (tokenizer.sha256() != index.tokenizer_sha256)
    return absl::FailedPreconditionError(absl::StrCat(path, ": sha256 ", tokenizer.sha256(),
                                                      " is not the index's tokenizer_sha256 ",
                                                      index.tokenizer_sha256));
  if (tokenizer.vocab_size() != index.vocab_size)
    return absl::FailedPreconditionError(absl::StrCat(path, ": has ", tokenizer.vocab_size(),
                                                      " pieces, the index's vocab_size is ",
                                                      index.vocab_size));
  return path;
}

// Appends the stream positions where the documents of `shard` (its first token at
// stream position `first`) start. The offsets are checked again: they rise from 0 to the
// shard's tokens.
absl::Status append_document_starts(const ShardReader& shard, int64_t first,
                                    std::vector<int64_t>& starts) {
  SY_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, shard.read_doc_offsets());
  const bool rising = !offsets.empty() && offsets.front() == 0 &&
                      offsets.back() == shard.num_tokens() &&
                      std::is_sorted(offsets.begin(), offsets.end());
  if (!rising)
    return absl::DataLossError(
        absl::StrCat(shard.path(), ": /doc_offsets changed since the shard was opened"));
  for (size_t i = 0; i + 1 < offsets.size(); ++i) starts.push_back(first + offsets[i]);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenDataset> TokenDataset::open(const std::string& dir, std::string_view split,
                                                const DatasetOpenOptions& options) {
  SY_ASSIGN_OR_RETURN(const DatasetIndex index, read_dataset_index(dir));
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();
  if (index.format_version != kTokenFormatVersion)
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": format_version ", index.format_version,
                     "; this build reads version ", kTokenFormatVersion,
                     " (prepare the dataset again with `switchyard data prepare`)"));
  if (!options.expected_tokenizer_sha256.empty() &&
      options.expected_tokenizer_sha256 != index.tokenizer_sha256)
    return absl::FailedPreconditionError(absl::StrCat(
        index_path, ": the dataset was made with tokenizer sha256 ", index.tokenizer_sha256,
        ", not the expected ", options.expected_tokenizer_sha256));
  if (options.expected_vocab_size > 0 && options.expected_vocab_size != index.vocab_size)
    return absl::FailedPreconditionError(absl::StrCat(index_path, ": the dataset has vocab_size ",
                                                      index.vocab_size, ", not the expected ",
                                                      options.expected_vocab_size));
  const auto split_it = index.splits.find(std::string(split));
  if (split_it == index.splits.end() || split_it->second.empty())
    return absl::NotFoundError(
        absl::StrCat(index_path, ": the dataset has no ", std::string(split), " shards"));

  TokenDataset d;
  d.dir_ = dir;
  d.split_ = std::string(split);
  d.vocab_size_ = index.vocab_size;
  d.tokenizer_sha256_ = index.tokenizer_sha256;
  d.special_ids_ = index.special_ids;
  if (!index.tokenizer_file.empty()) {
    SY_ASSIGN_OR_RETURN(d.tokenizer_path_, checked_tokenizer_path(dir, index));
  }
  const std::string verdicts = options.remember_verdicts ? default_verdict_cache_dir() : "";
  for (size_t i = 0; i < split_it->second.size(); ++i) {
    const ShardEntry& entry = split_it->second[i];
    SY_ASSIGN_OR_RETURN(
        const std::string path,
        path_in_directory(dir, entry.file,
                          absl::StrCat(index_path, ": field splits.", d.split_, "[", i, "].file")));
    SY_ASSIGN_OR_RETURN(const int64_t bytes, regular_file_size(path));
    if (bytes != entry.bytes)
      return absl::DataLossError(absl::StrCat(path, ": is ", bytes, " bytes, the index says ",
                                              entry.bytes, " (truncated or replaced?)"));
    if (options.verify_checksums)
      SY_RETURN_IF_ERROR(verify_file_sha256(path, entry.sha256, verdicts));
    SY_ASSIGN_OR_RETURN(std::shared_ptr<ShardReader> shard, ShardReader::open(path));
    const ShardAttributes& a = shard->attributes();
    if (a.tokenizer_sha256 != index.tokenizer_sha256)
      return absl::FailedPreconditionError(absl::StrCat(path, ": made with tokenizer sha256 ",
                                                        a.tokenizer_sha256, ", the index says ",
                                                        index.tokenizer_sha256));
    if (a.vocab_size != index.vocab_size)
      return absl::FailedPreconditionError(absl::StrCat(path, ": has vocab_size ", a.vocab_size,
                                                        ", the index says ", index.vocab_size));
    if (shard->num_tokens() != entry.tokens || shard->num_documents() != entry.documents)
      return absl::DataLossError(absl::StrCat(path, ": holds ", shard->num_tokens(), " tokens in ",
                                              shard->num_documents(), " documents, the index says ",
                                              entry.tokens, " in ", entry.documents));
    if (options.with_documents || options.pad_documents)
      SY_RETURN_IF_ERROR(append_document_starts(*shard, d.shard_starts_.back(), d.document_starts_));
    d.num_documents_ += shard->num_documents();
    d.has_loss_mask_ = d.has_loss_mask_ || shard->has_loss_mask();
    d.shard_starts_.push_back(d.shard_starts_.back() + shard->num_tokens());
    d.shards_.push_back(std::move(shard));
  }
  d.with_documents_ = options.with_documents || options.pad_documents;
  d.pad_documents_ = options.pad_documents;
  return d;
}

absl::Status TokenDataset::read_tokens(int64_t start, int64_t count, int32_t* out) const {
  return for_each_shard_range(start, count, [&](const ShardReader& shard, int64_t local,
                                                int64_t take) {
    SY_RETURN_IF_ERROR(shard.read_tokens(local, take, out));
    out += take;
    return absl::OkStatus();
  });
}

absl::Status TokenDataset::read_loss_mask(int64_t start, int64_t count, uint8_t* out) const {
  return for_each_shard_range(start, count, [&](const ShardReader& shard, int64_t local,
                                                int64_t take) {
    SY_RETURN_IF_ERROR(shard.read_loss_mask(local, take, out));
    out += take;
    return absl::OkStatus();
  });
}

absl::Status TokenDataset::for_each_shard_range(
    int64_t start, int64_t count,
    const std::function<absl::Status(const ShardReader&, int64_t, int64_t)>& visit) const {
  SY_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens());
  // The last shard whose first token is at or before `start`.
  size_t s = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), start) -
             shard_starts_.begin() - 1;
  while (count > 0) {
    const int64_t local = start - shard_starts_[s];
    const int64_t take = std::min(count, shards_[s]->num_tokens() - local);
    SY_RETURN_IF_ERROR(visit(*shards_[s], local, take));
    start += take;
    count -= take;
    ++s;
  }
  return absl::OkStatus();
}

absl::Status TokenDataset::read_window(int64_t window, int64_t seq_len, int32_t* ids,
                                       int32_t* targets) const {
  SY_CHECK(window >= 0 && window < num_windows(seq_len));
  return pad_documents_ ? read_padded_window(window, seq_len, ids, targets)
                        : read_packed_window(window, seq_len, ids, targets);
}

absl::Status TokenDataset::read_packed_window(int64_t window, int64_t seq_len, int32_t* ids,
                                              int32_t* targets) const {
  thread_local std::vector<int32_t> tokens;
  tokens.resize(static_cast<size_t>(seq_len + 1));
  SY_RETURN_IF_ERROR(read_tokens(window * seq_len, seq_len + 1, tokens.data()));
  std::copy(tokens.begin(), tokens.end() - 1, ids);
  std::copy(tokens.begin() + 1, tokens.end(), targets);
  return mask_targets(window * seq_len + 1, seq_len, targets);
}

int64_t TokenDataset::window_tokens(int64_t window, int64_t seq_len) const {
  if (!pad_documents_) return seq_len;
  const size_t w = static_cast<size_t>(window);
  const int64_t end = w + 1 < document_starts_.size() ? document_starts_[w + 1] : num_tokens();
  return std::min(end - document_starts_[w], seq_len);
}

absl::Status TokenDataset::read_padded_window(int64_t window, int64_t seq_len, int32_t* ids,
                                              int32_t* targets) const {
  const size_t w = static_cast<size_t>(window);
  const int64_t first = document_starts_[w];
  const int64_t end = w + 1 < document_starts_.size() ? document_starts_[w + 1] : num_tokens();
  const int64_t count = std::min(end - first, seq_len + 1);
  std::fill(ids, ids + seq_len, pad_id());
  std::fill(targets, targets + seq_len, kIgnoredTarget);
  if (count == 0) return absl::OkStatus();
  thread_local std::vector<int32_t> tokens;
  tokens.resize(static_cast<size_t>(count));
  SY_RETURN_IF_ERROR(read_tokens(first, count, tokens.data()));
  std::copy(tokens.begin(), tokens.begin() + std::min(count, seq_len), ids);
  std::copy(tokens.begin() + 1, tokens.end(), targets);
  return mask_targets(first + 1, count - 1, targets);
}

absl::Status TokenDataset::mask_targets(int64_t first, int64_t count, int32_t* targets) const {
  if (!has_loss_mask_) return absl::OkStatus();
  thread_local std::vector<uint8_t> mask;
  mask.resize(static_cast<size_t>(count));
  SY_RETURN_IF_ERROR(read_loss_mask(first, count, mask.data()));
  for (int64_t i = 0; i < count; ++i)
    if (mask[i] == 0) targets[i] = kIgnoredTarget;
  return absl::OkStatus();
}

int32_t TokenDataset::pad_id() const {
  if (special_ids_.pad >= 0) return static_cast<int32_t>(special_ids_.pad);
  return static_cast<int32_t>(std::max<int64_t>(special_ids_.eos, 0));
}

void TokenDataset::window_document_starts(int64_t window, int64_t seq_len, int32_t* starts) const {
  SY_CHECK_MSG(with_documents_, "window_document_starts: the dataset was opened without documents");
  SY_CHECK(window >= 0 && window < num_windows(seq_len));
  if (pad_documents_) {  // a window is one document
    std::fill(starts, starts + seq_len, 0);
    return;
  }
  const int64_t first = window * seq_len;
  // The first document start after the window's first position.
  auto next = std::upper_bound(document_starts_.begin(), document_starts_.end(), first);
  int32_t start = 0;
  for (int64_t i = 0; i < seq_len; ++i) {
    for (; next != document_starts_.end() && *next == first + i; ++next)
      start = static_cast<int32_t>(i);
    starts[i] = start;
  }
}

}  // namespace switchyard
