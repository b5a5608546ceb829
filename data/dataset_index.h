// The index of a token dataset directory: <dir>/index.json lists every shard of every
// split with its token and document counts, size and sha256 (schema in docs/data.md).
// It is written last, so a directory without it is not a finished dataset.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/runtime/json_fields.h"
#include "data/tokenizer.h"

namespace switchyard {

inline constexpr char kIndexFileName[] = "index.json";
inline constexpr char kIndexFormatName[] = "switchyard-tokens";

struct ShardEntry {
  std::string file;  // a name in the dataset directory, checked when the shard is opened
  int64_t tokens = 0;
  int64_t documents = 0;
  int64_t bytes = 0;
  std::string sha256;
};

struct DatasetIndex {
  int64_t format_version = 0;
  std::string tokenizer_sha256;
  std::string tokenizer_file;  // relative to the directory; empty when not kept there
  int64_t vocab_size = 0;
  SpecialTokenIds special_ids;
  std::map<std::string, std::vector<ShardEntry>> splits;  // "train", "val"
};

// "train-00003-of-00012.h5"
std::string shard_file_name(std::string_view split, int64_t index, int64_t count);

// 64 lower-case hex digits (a sha256 digest as sha256sum prints it).
bool is_sha256_hex(const std::string& text);

// One shard's entry, as the index lists it (also in data/prepare_parts.h's part records):
// read with its checks (documents <= tokens, a sha256 of 64 hex digits), and written.
absl::StatusOr<ShardEntry> read_shard_entry(const JsonFields& shard);
nlohmann::ordered_json shard_entry_json(const ShardEntry& e);

// Checks types and ranges (documents <= tokens, special ids inside the vocabulary, sha256
// digests of 64 hex digits, no file listed twice); names are resolved by their users
// through path_in_directory.
absl::StatusOr<DatasetIndex> read_dataset_index(const std::string& dir);
// Atomically (temporary file, fsync, rename).
absl::Status write_dataset_index(const std::string& dir, const DatasetIndex& index);

}  // namespace switchyard
