#include "data/dataset_index.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"

namespace switchyard {
std::string shard_file_name(std::string_view split, int64_t index, int64_t count) {
  return absl::StrFormat("%s-%05d-of-%05d.h5", split, index, count);
}

bool is_sha256_hex(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

absl::StatusOr<ShardEntry> read_shard_entry(const JsonFields& shard) {
  ShardEntry e;
  SY_ASSIGN_OR_RETURN(e.file, shard.string("file"));
  SY_ASSIGN_OR_RETURN(e.tokens, shard.integer("tokens"));
  SY_ASSIGN_OR_RETURN(e.documents, shard.integer("documents", 0, e.tokens));
  SY_ASSIGN_OR_RETURN(e.bytes, shard.integer("bytes"));
  SY_ASSIGN_OR_RETURN(e.sha256, shard.string("sha256"));
  if (!is_sha256_hex(e.sha256)) return shard.error("sha256", "must be 64 lower-case hex digits");
  return e;
}

nlohmann::ordered_json shard_entry_json(const ShardEntry& e) {
  return {{"file", e.file},
          {"tokens", e.tokens},
          {"documents", e.documents},
          {"bytes", e.bytes},
          {"sha256", e.sha256}};
}

absl::StatusOr<DatasetIndex> read_dataset_index(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kIndexFileName).string();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat(dir, ": no such dataset directory"));
  if (!std::filesystem::exists(path, ec))
    return absl::NotFoundError(
        absl::StrCat(path, ": missing; not a prepared dataset (or its prepare did not finish)"));
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  SY_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json_object(text, path));
  const JsonFields r(j, path);
  SY_ASSIGN_OR_RETURN(const std::string format, r.string("format"));
  if (format != kIndexFormatName)
    return r.error("format",
                   absl::StrCat("is \"", format, "\", expected \"", kIndexFormatName, "\""));
  DatasetIndex index;
  SY_ASSIGN_OR_RETURN(index.format_version, r.integer("format_version"));
  SY_ASSIGN_OR_RETURN(index.tokenizer_sha256, r.string("tokenizer_sha256"));
  SY_ASSIGN_OR_RETURN(index.tokenizer_file, r.string_or("tokenizer_file", ""));
  SY_ASSIGN_OR_RETURN(index.vocab_size, r.integer("vocab_size", 1, kMaxVocabSize));
  if (r.has("special_ids")) {
    SY_ASSIGN_OR_RETURN(const JsonFields special, r.object("special_ids"));
    const int64_t hi = index.vocab_size - 1;
    SY_ASSIGN_OR_RETURN(index.special_ids.unk, special.integer_or("unk", -1, -1, hi));
    SY_ASSIGN_OR_RETURN(index.special_ids.bos, special.integer_or("bos", -1, -1, hi));
    SY_ASSIGN_OR_RETURN(index.special_ids.eos, special.integer_or("eos", -1, -1, hi));
    SY_ASSIGN_OR_RETURN(index.special_ids.pad, special.integer_or("pad", -1, -1, hi));
  }
  SY_ASSIGN_OR_RETURN(const JsonFields splits, r.object("splits"));
  std::map<std::string, std::string> listed;  // file -> the field that first listed it
  for (const auto& [split, shards] : splits.json().items()) {
    if (!shards.is_array()) return splits.error(split, "must be a list of shards");
    std::vector<ShardEntry>& entries = index.splits[split];
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string field = absl::StrCat(split, "[", i, "]");
      if (!shards[i].is_object()) return splits.error(field, "must be an object");
      SY_ASSIGN_OR_RETURN(ShardEntry e, read_shard_entry(splits.element(shards[i], split, i)));
      const auto [first, added] = listed.emplace(e.file, absl::StrCat("splits.", field, ".file"));
      if (!added)
        return splits.error(absl::StrCat(field, ".file"),
                            absl::StrCat("lists \"", e.file, "\" again (", first->second, ")"));
      entries.push_back(std::move(e));
    }
  }
  return index;
}

absl::Status write_dataset_index(const std::string& dir, const DatasetIndex& index) {
  nlohmann::ordered_json j;
  j["format"] = kIndexFormatName;
  j["format_version"] = index.format_version;
  j["tokenizer_sha256"] = index.tokenizer_sha256;
  if (!index.tokenizer_file.empty()) j["tokenizer_file"] = index.tokenizer_file;
  j["vocab_size"] = index.vocab_size;
  j["special_ids"] = {{"unk", index.special_ids.unk},
                      {"bos", index.special_ids.bos},
                      {"eos", index.special_ids.eos},
                      {"pad", index.special_ids.pad}};
  j["splits"] = nlohmann::ordered_json::object();
  for (const auto& [split, shards] : index.splits) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ShardEntry& e : shards)
      list.push_back(shard_entry_json(e));
    j["splits"][split] = std::move(list);
  }
  return write_file_atomically((std::filesystem::path(dir) / kIndexFileName).string(),
                               j.dump(2) + "\n");
}

}  // namespace switchyard
