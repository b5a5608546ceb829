#include "data/prepare_parts.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/numbers.h"
#include "core/runtime/status_macros.h"
#include "data/prepare.h"
#include "data/sha256.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// A decimal integer that is all of `text`.
bool parse_integer(std::string_view text, int64_t* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

std::string part_stem(PartId id) {
  return absl::StrFormat("part-%05d-of-%05d", id.index, id.count);
}

absl::StatusOr<std::vector<ShardEntry>> read_part_shards(const JsonFields& splits, PartId id,
                                                         int split) {
  const char* name = kSplitNames[split];
  const nlohmann::json* list = splits.find(name);
  if (!list || !list->is_array()) return splits.error(name, "must be a list of shards");
  std::vector<ShardEntry> shards;
  for (size_t k = 0; k < list->size(); ++k) {
    const nlohmann::json& item = (*list)[k];
    if (!item.is_object())
      return splits.error(absl::StrCat(name, "[", k, "]"), "must be an object");
    const JsonFields fields = splits.element(item, name, k);
    SY_ASSIGN_OR_RETURN(ShardEntry e, read_shard_entry(fields));
    const std::string want = part_shard_name(id, split, static_cast<int64_t>(k));
    if (e.file != want) return fields.error("file", absl::StrCat("must be \"", want, "\""));
    shards.push_back(std::move(e));
  }
  return shards;
}

absl::Status read_arguments(const JsonFields& r, PartRecord* record) {
  const nlohmann::json* arguments = r.find("arguments");
  if (!arguments || !arguments->is_object()) return r.error("arguments", "must be an object");
  record->arguments = *arguments;
  SY_ASSIGN_OR_RETURN(const JsonFields a, r.object("arguments"));
  SY_ASSIGN_OR_RETURN(record->val_fraction, a.number_or("val_fraction", -1, 0, 1));
  if (!a.has("val_fraction") || record->val_fraction >= 1)
    return a.error("val_fraction", "must be a number in [0, 1)");
  SY_ASSIGN_OR_RETURN(record->tokenizer_sha256, a.string("tokenizer_sha256"));
  if (!is_sha256_hex(record->tokenizer_sha256))
    return a.error("tokenizer_sha256", "must be 64 lower-case hex digits");
  SY_ASSIGN_OR_RETURN(record->fingerprint, r.string("fingerprint"));
  if (record->fingerprint != fingerprint_of(record->arguments))
    return r.error("fingerprint", "is not the sha256 of the arguments (the record was edited)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PartId> parse_part_id(std::string_view text) {
  const absl::string_view spec(text.data(), text.size());
  const size_t slash = spec.find('/');
  if (slash == absl::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat("--part: ", spec, " is not I/N, part I of N"));
  PartId id;
  SY_ASSIGN_OR_RETURN(id.count, parse_int64(spec.substr(slash + 1), "--part N", 1, kMaxParts));
  SY_ASSIGN_OR_RETURN(id.index, parse_int64(spec.substr(0, slash), "--part I", 0, id.count - 1));
  return id;
}

std::string part_record_name(PartId id) { return part_stem(id) + ".json"; }

std::string part_shard_name(PartId id, int split, int64_t shard) {
  return absl::StrFormat(".%s.%s-%05d.h5", part_stem(id), kSplitNames[split], shard);
}

std::pair<size_t, size_t> part_inputs(size_t files, PartId id) {
  const auto bound = [&](int64_t i) {
    return static_cast<size_t>(static_cast<int64_t>(files) * i / id.count);
  };
  return {bound(id.index), bound(id.index + 1)};
}

bool is_val_document(int64_t i, double val_fraction) {
  return static_cast<int64_t>(static_cast<double>(i + 1) * val_fraction) >
         static_cast<int64_t>(static_cast<double>(i) * val_fraction);
}

std::string fingerprint_of(const nlohmann::json& arguments) {
  return sha256_hex(arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool holds_recorded_shard(const std::string& path, const ShardEntry& entry) {
  const absl::StatusOr<int64_t> bytes = regular_file_size(path);
  if (!bytes.ok() || *bytes != entry.bytes) return false;
  const absl::StatusOr<std::string> sha256 = sha256_file(path);
  return sha256.ok() && *sha256 == entry.sha256;
}

absl::StatusOr<PartRecord> read_part_record(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  SY_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json_object(text, path));
  const JsonFields r(j, path);
  SY_ASSIGN_OR_RETURN(const std::string format, r.string("format"));
  if (format != kPartFormatName)
    return r.error("format",
                   absl::StrCat("is \"", format, "\", expected \"", kPartFormatName, "\""));
  PartRecord record;
  SY_ASSIGN_OR_RETURN(record.id.count, r.integer("parts", 1, kMaxParts));
  SY_ASSIGN_OR_RETURN(record.id.index, r.integer("part", 0, record.id.count - 1));
  SY_RETURN_IF_ERROR(read_arguments(r, &record));
  SY_ASSIGN_OR_RETURN(record.first_document, r.integer("first_document"));
  SY_ASSIGN_OR_RETURN(record.finished, r.boolean_or("finished", false));
  SY_ASSIGN_OR_RETURN(record.documents, r.integer("documents"));
  SY_ASSIGN_OR_RETURN(const JsonFields splits, r.object("splits"));
  int64_t documents = 0;
  for (int s = 0; s < 2; ++s) {
    SY_ASSIGN_OR_RETURN(record.shards[s], read_part_shards(splits, record.id, s));
    for (const ShardEntry& e : record.shards[s]) {
      if (e.documents > record.documents - documents)
        return r.error("documents", "is fewer than its shards hold");
      documents += e.documents;
    }
  }
  if (record.finished && documents != record.documents)
    return r.error("documents", absl::StrCat("is ", record.documents, " but its shards hold ",
                                             documents, " documents"));
  return record;
}

absl::Status write_part_record(const std::string& path, const PartRecord& record) {
  nlohmann::ordered_json j;
  j["format"] = kPartFormatName;
  j["part"] = record.id.index;
  j["parts"] = record.id.count;
  j["fingerprint"] = record.fingerprint;
  j["arguments"] = record.arguments;
  j["first_document"] = record.first_document;
  j["finished"] = record.finished;
  j["documents"] = record.documents;
  j["splits"] = nlohmann::ordered_json::object();
  for (int s = 0; s < 2; ++s) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ShardEntry& e : record.shards[s]) list.push_back(shard_entry_json(e));
    j["splits"][kSplitNames[s]] = std::move(list);
  }
  return write_file_atomically(path, j.dump(2) + "\n");
}

absl::StatusOr<std::vector<int64_t>> part_counts_in(const std::string& dir) {
  std::vector<int64_t> counts;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t index = 0, count = 0;
    constexpr std::string_view kPrefix = "part-", kOf = "-of-", kSuffix = ".json";
    if (name.size() != kPrefix.size() + 5 + kOf.size() + 5 + kSuffix.size() ||
        !name.starts_with(kPrefix) || !name.ends_with(kSuffix) ||
        name.substr(kPrefix.size() + 5, kOf.size()) != kOf ||
        !parse_integer(std::string_view(name).substr(kPrefix.size(), 5), &index) ||
        !parse_integer(std::string_view(name).substr(kPrefix.size() + 5 + kOf.size(), 5), &count))
      continue;
    counts.push_back(count);
  }
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

namespace {

// Every part record of `dir`, checked against each other: all there, finished, made with
// part 0's arguments, and each starting at the document where the one before it ended.
absl::StatusOr<std::vector<PartRecord>> read_parts(const std::string& dir) {
  SY_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, part_counts_in(dir));
  if (counts.empty())
    return absl::NotFoundError(
        absl::StrCat(dir, ": holds no part records (part-*-of-*.json): nothing to merge"));
  if (counts.size() > 1)
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": holds the parts of prepares split into ", counts.front(), " and into ",
                     counts.back(), "; keep the parts of one"));
  std::vector<PartRecord> parts;
  for (int64_t i = 0; i < counts.front(); ++i) {
    const PartId id{i, counts.front()};
    const std::string path = (fs::path(dir) / part_record_name(id)).string();
    const std::string which = absl::StrCat("part ", i, "/", id.count);
    std::error_code ec;
    if (!fs::exists(path, ec))
      return absl::NotFoundError(absl::StrCat(path, ": missing: ", which,
                                              " has not run (data prepare ... --part ", i, "/",
                                              id.count, ")"));
    SY_ASSIGN_OR_RETURN(PartRecord record, read_part_record(path));
    if (record.id.index != i || record.id.count != id.count)
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": is the record of part ", record.id.index, "/", record.id.count,
                       ", not of ", which, " (a renamed or copied record)"));
    if (!record.finished)
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": ", which, " has not finished; run its data prepare again to resume it"));
    if (i > 0 && record.fingerprint != parts.front().fingerprint)
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": made with other arguments, tokenizer, template or inputs than ",
                       part_record_name(parts.front().id), "; prepare it again with theirs"));
    const int64_t expected = i == 0 ? 0 : parts.back().first_document + parts.back().documents;
    if (record.first_document != expected)
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": starts at document ", record.first_document,
                       " but the parts before it end at ", expected));
    parts.push_back(std::move(record));
  }
  return parts;
}

// A validation fraction asked for and no document held out: training would have nothing
// to evaluate on.
absl::Status check_val_split(const std::string& dir, const std::vector<PartRecord>& parts) {
  int64_t documents = 0;
  for (const PartRecord& part : parts) {
    documents += part.documents;
    if (!part.shards[1].empty()) return absl::OkStatus();
  }
  const double f = parts.front().val_fraction;
  if (f == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      dir, ": ", documents, " documents are too few to hold out a validation fraction of ", f,
      " (none would be held out): raise it (data prepare --val-fraction, a recipe's "
      "data.val_fraction), or make it 0 for no validation split and train with "
      "train.eval_interval=0"));
}

struct ShardMove {
  std::string from, to;  // paths: the part's name, the dataset's
  ShardEntry entry;      // under the dataset's name
};

// Where each part's shards go: split by split, part by part, in order.
std::vector<ShardMove> plan_moves(const std::string& dir, const std::vector<PartRecord>& parts,
                                  int split) {
  int64_t count = 0;
  for (const PartRecord& part : parts) count += static_cast<int64_t>(part.shards[split].size());
  std::vector<ShardMove> moves;
  for (const PartRecord& part : parts)
    for (const ShardEntry& e : part.shards[split]) {
      ShardMove move{(fs::path(dir) / e.file).string(), "", e};
      move.entry.file =
          shard_file_name(kSplitNames[split], static_cast<int64_t>(moves.size()), count);
      move.to = (fs::path(dir) / move.entry.file).string();
      moves.push_back(std::move(move));
    }
  return moves;
}

// Checks that each shard is the one its part recorded (at its part name, or at its
// dataset name where an interrupted merge already moved it).
absl::Status check_shards(const std::vector<ShardMove>& moves, DataProgressSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  DataProgress progress;
  progress.stage = "merge";
  for (const ShardMove& move : moves) progress.bytes_total += move.entry.bytes;
  for (const ShardMove& move : moves) {
    std::error_code ec;
    const std::string& path = fs::exists(move.from, ec) ? move.from : move.to;
    if (!holds_recorded_shard(path, move.entry))
      return absl::DataLossError(
          absl::StrCat(move.from,
                       ": missing or not the shard its part record lists (size or sha256 differ); "
                       "prepare that part again"));
    progress.bytes_done += move.entry.bytes;
    progress.documents += move.entry.documents;
    progress.tokens += move.entry.tokens;
    progress.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.finished = &move == &moves.back();
    sink.on_progress(progress);
  }
  return absl::OkStatus();
}

absl::Status move_shards(const std::vector<ShardMove>& moves) {
  for (const ShardMove& move : moves) {
    std::error_code ec;
    if (!fs::exists(move.from, ec)) continue;
    fs::rename(move.from, move.to, ec);
    if (ec)
      return absl::InternalError(absl::StrCat(move.to, ": cannot move into place: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrepareSummary> merge_parts(const std::string& dir, DataProgressSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  if (fs::exists(fs::path(dir) / kIndexFileName, ec))
    return absl::AlreadyExistsError(absl::StrCat(dir, ": already holds a dataset (index.json)"));
  SY_ASSIGN_OR_RETURN(const std::vector<PartRecord> parts, read_parts(dir));
  const std::string tokenizer_path = (fs::path(dir) / kTokenizerFileName).string();
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
  if (tokenizer.sha256() != parts.front().tokenizer_sha256)
    return absl::FailedPreconditionError(absl::StrCat(
        tokenizer_path, ": not the tokenizer the parts were made with (sha256 differs)"));
  SY_RETURN_IF_ERROR(check_val_split(dir, parts));
  std::vector<ShardMove> moves[2] = {plan_moves(dir, parts, 0), plan_moves(dir, parts, 1)};
  std::vector<ShardMove> all = moves[0];
  all.insert(all.end(), moves[1].begin(), moves[1].end());
  SY_RETURN_IF_ERROR(check_shards(all, sink));
  SY_RETURN_IF_ERROR(move_shards(all));

  DatasetIndex index;
  index.format_version = kTokenFormatVersion;
  index.tokenizer_sha256 = tokenizer.sha256();
  index.tokenizer_file = kTokenizerFileName;
  index.vocab_size = tokenizer.vocab_size();
  index.special_ids = tokenizer.special_ids();
  PrepareSummary summary;
  for (int s = 0; s < 2; ++s) {
    std::vector<ShardEntry>& entries = index.splits[kSplitNames[s]];
    for (const ShardMove& move : moves[s]) {
      entries.push_back(move.entry);
      summary.documents[s] += move.entry.documents;
      summary.tokens[s] += move.entry.tokens;
    }
    summary.shards[s] = static_cast<int64_t>(entries.size());
  }
  SY_RETURN_IF_ERROR(write_dataset_index(dir, index));
  SY_RETURN_IF_ERROR(fsync_path(dir));
  for (const PartRecord& part : parts) fs::remove(fs::path(dir) / part_record_name(part.id), ec);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace switchyard
