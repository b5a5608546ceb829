// `switchyard inspect` on token data: describes a dataset directory or a single shard
// and validates it in full (checksums against the index, structure, every token id
// below vocab_size, document offsets). The first failure is the returned error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard {

struct InspectOptions {
  // Decodes the sample; when empty, the tokenizer kept in the dataset directory is used.
  std::string tokenizer_path;
  int64_t sample_tokens = 64;
};

struct ShardReport {
  std::string path;
  std::string split;  // empty for a lone shard outside an index
  TokenDType dtype = TokenDType::kUint16;
  int64_t tokens = 0;
  int64_t documents = 0;
  int64_t bytes = 0;
  int64_t max_token_id = -1;
  int64_t loss_tokens = -1;  // tokens whose loss mask entry is 1; -1 without a /loss_mask
  bool checksum_checked = false;  // false only for a shard no index lists
};

struct InspectReport {
  std::string path;
  bool is_directory = false;
  int64_t format_version = 0;
  std::string tokenizer_sha256;
  int64_t vocab_size = 0;
  SpecialTokenIds special_ids;
  std::vector<ShardReport> shards;
  std::string sample_tokenizer;     // the model that decoded `sample`, or "" when none
  std::vector<int32_t> sample_ids;  // the first tokens of the first shard
  std::string sample;
};

absl::StatusOr<InspectReport> inspect_token_data(const std::string& path,
                                                 const InspectOptions& options);

}  // namespace switchyard
