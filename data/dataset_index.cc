#include "data/dataset_index.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/file_util.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

using json = nlohmann::json;

class FieldReader {
 public:
  explicit FieldReader(const std::string& path) : path_(path) {}

  absl::StatusOr<const json*> get(const json& object, const char* name, json::value_t type,
                                  const std::string& where, bool required = true) const {
    const auto it = object.find(name);
    if (it == object.end()) {
      if (!required) return nullptr;
      return error(absl::StrCat(where, "\"", name, "\" is missing"));
    }
    const bool matches =
        type == json::value_t::number_integer ? it->is_number_integer() : it->type() == type;
    if (!matches) return error(absl::StrCat(where, "\"", name, "\" has the wrong type"));
    return &*it;
  }
  // Without a fallback the field is required.
  absl::StatusOr<int64_t> integer(const json& object, const char* name, const std::string& where,
                                  std::optional<int64_t> fallback = std::nullopt) const {
    SY_ASSIGN_OR_RETURN(const json* field, get(object, name, json::value_t::number_integer, where,
                                               !fallback.has_value()));
    return field ? field->get<int64_t>() : *fallback;
  }
  absl::StatusOr<std::string> string(const json& object, const char* name, const std::string& where,
                                     bool required = true) const {
    SY_ASSIGN_OR_RETURN(const json* field,
                        get(object, name, json::value_t::string, where, required));
    return field ? field->get<std::string>() : std::string();
  }
  absl::Status error(const std::string& text) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", text));
  }

 private:
  const std::string& path_;
};

}  // namespace

std::string shard_file_name(std::string_view split, int64_t index, int64_t count) {
  return absl::StrFormat("%s-%05d-of-%05d.h5", split, index, count);
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
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const FieldReader r(path);
  if (j.is_discarded() || !j.is_object()) return r.error("not a JSON object");
  SY_ASSIGN_OR_RETURN(const std::string format, r.string(j, "format", ""));
  if (format != kIndexFormatName)
    return r.error(absl::StrCat("format is \"", format, "\", expected \"", kIndexFormatName, "\""));
  DatasetIndex index;
  SY_ASSIGN_OR_RETURN(index.format_version, r.integer(j, "format_version", ""));
  SY_ASSIGN_OR_RETURN(index.tokenizer_sha256, r.string(j, "tokenizer_sha256", ""));
  SY_ASSIGN_OR_RETURN(index.tokenizer_file, r.string(j, "tokenizer_file", "", false));
  SY_ASSIGN_OR_RETURN(index.vocab_size, r.integer(j, "vocab_size", ""));
  if (index.vocab_size <= 0) return r.error("vocab_size must be positive");
  SY_ASSIGN_OR_RETURN(const json* special,
                      r.get(j, "special_ids", json::value_t::object, "", false));
  if (special) {
    SY_ASSIGN_OR_RETURN(index.special_ids.unk, r.integer(*special, "unk", "special_ids.", -1));
    SY_ASSIGN_OR_RETURN(index.special_ids.bos, r.integer(*special, "bos", "special_ids.", -1));
    SY_ASSIGN_OR_RETURN(index.special_ids.eos, r.integer(*special, "eos", "special_ids.", -1));
    SY_ASSIGN_OR_RETURN(index.special_ids.pad, r.integer(*special, "pad", "special_ids.", -1));
  }
  SY_ASSIGN_OR_RETURN(const json* splits, r.get(j, "splits", json::value_t::object, ""));
  for (const auto& [split, shards] : splits->items()) {
    const std::string where = absl::StrCat("splits.", split);
    if (!shards.is_array()) return r.error(absl::StrCat(where, " must be a list of shards"));
    std::vector<ShardEntry>& entries = index.splits[split];
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string at = absl::StrCat(where, "[", i, "].");
      if (!shards[i].is_object()) return r.error(absl::StrCat(at, " must be an object"));
      ShardEntry e;
      SY_ASSIGN_OR_RETURN(e.file, r.string(shards[i], "file", at));
      SY_ASSIGN_OR_RETURN(e.tokens, r.integer(shards[i], "tokens", at));
      SY_ASSIGN_OR_RETURN(e.documents, r.integer(shards[i], "documents", at));
      SY_ASSIGN_OR_RETURN(e.bytes, r.integer(shards[i], "bytes", at));
      SY_ASSIGN_OR_RETURN(e.sha256, r.string(shards[i], "sha256", at));
      if (e.file.empty() || e.file.find('/') != std::string::npos)
        return r.error(absl::StrCat(at, "file must be a file name inside the directory"));
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
      list.push_back({{"file", e.file},
                      {"tokens", e.tokens},
                      {"documents", e.documents},
                      {"bytes", e.bytes},
                      {"sha256", e.sha256}});
    j["splits"][split] = std::move(list);
  }
  return write_file_atomically((std::filesystem::path(dir) / kIndexFileName).string(),
                               j.dump(2) + "\n");
}

}  // namespace switchyard
