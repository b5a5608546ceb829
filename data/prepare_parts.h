// The parts of a `data prepare` (docs/data.md#resuming-and-parts). A prepare is part i of
// n (a prepare without --part is part 0 of 1): it takes input files [i F / n, (i + 1) F / n)
// of the F given, numbers its documents after those of the files before them (which it
// reads, without encoding them, to count), writes its shards under hidden names
// (".part-00002-of-00008.train-00000.h5") and keeps a record of them,
// part-00002-of-00008.json, rewritten atomically each time one of its shards is complete
// and a last time, `finished`, when the part is. The record lets a killed part continue
// from its last complete shard; merge_parts (data/prepare.h) turns the finished parts of a
// directory into one dataset.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/dataset_index.h"

namespace switchyard {

inline constexpr char kPartFormatName[] = "switchyard-prepare-part";
inline constexpr int64_t kMaxParts = 99999;
inline constexpr const char* kSplitNames[2] = {"train", "val"};
inline constexpr char kTokenizerFileName[] = "tokenizer.model";  // part 0 writes it

struct PartId {
  int64_t index = 0;
  int64_t count = 1;
};

// "2/8" -> part 2 of 8 (0 <= I < N <= kMaxParts, each read by core/runtime/numbers.h);
// anything else is one line naming --part.
absl::StatusOr<PartId> parse_part_id(std::string_view text);
// "part-00002-of-00008.json"
std::string part_record_name(PartId id);
// ".part-00002-of-00008.train-00003.h5": shard `shard` of split `split` (0 train, 1 val).
std::string part_shard_name(PartId id, int split, int64_t shard);
// The input files [first, second) of `files` that part `id` takes (count <= files).
std::pair<size_t, size_t> part_inputs(size_t files, PartId id);
// Whether document `i` (counting all inputs) goes to the validation split, for
// val_fraction f: floor((i + 1) f) > floor(i f).
bool is_val_document(int64_t i, double val_fraction);

struct PartRecord {
  PartId id;
  // What the output depends on, the same for every part of one prepare: the tokenizer's
  // and chat template's sha256, the options, and each input's path, size and mtime.
  nlohmann::json arguments;
  std::string fingerprint;       // fingerprint_of(arguments)
  double val_fraction = 0;       // arguments' val_fraction
  std::string tokenizer_sha256;  // arguments' tokenizer_sha256
  int64_t first_document = 0;    // the part's first document, counting all inputs
  bool finished = false;
  int64_t documents = 0;              // the part's documents once finished, else its shards'.
  std::vector<ShardEntry> shards[2];  // its complete shards of train and val, in order
};

// sha256 of the arguments as compact JSON (keys sorted; invalid UTF-8 replaced).
std::string fingerprint_of(const nlohmann::json& arguments);
// Whether `path` is a regular file of the entry's size and sha256 (read only when the
// size matches).
bool holds_recorded_shard(const std::string& path, const ShardEntry& entry);
// Checks types and ranges, that the fingerprint is the arguments', that every shard has
// its part_shard_name and, once finished, that the shards hold its documents.
absl::StatusOr<PartRecord> read_part_record(const std::string& path);
absl::Status write_part_record(const std::string& path, const PartRecord& record);
// The part counts of the records in `dir` (file names part-*-of-N.json), sorted and unique.
absl::StatusOr<std::vector<int64_t>> part_counts_in(const std::string& dir);

}  // namespace switchyard
