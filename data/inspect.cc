#include "data/inspect.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/dataset_index.h"
#include "data/sha256.h"
#include "data/token_dataset.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

ShardReport describe(const ShardReader& shard, const std::string& split) {
  ShardReport r;
  r.path = shard.path();
  r.split = split;
  r.dtype = shard.dtype();
  r.tokens = shard.num_tokens();
  r.documents = shard.num_documents();
  std::error_code ec;
  r.bytes = static_cast<int64_t>(fs::file_size(shard.path(), ec));
  return r;
}

// Reads every token id (the largest must be below the vocabulary) and loss mask entry.
absl::Status scan(const ShardReader& shard, ShardReport& r) {
  SY_ASSIGN_OR_RETURN(r.max_token_id, shard.scan_max_token());
  if (shard.has_loss_mask()) {
    SY_ASSIGN_OR_RETURN(r.loss_tokens, shard.count_loss_tokens());
  }
  return absl::OkStatus();
}

absl::Status inspect_directory(const std::string& dir, InspectReport& report) {
  SY_ASSIGN_OR_RETURN(const DatasetIndex index, read_dataset_index(dir));
  report.is_directory = true;
  report.format_version = index.format_version;
  report.tokenizer_sha256 = index.tokenizer_sha256;
  report.vocab_size = index.vocab_size;
  report.special_ids = index.special_ids;
  DatasetOpenOptions verify;
  verify.remember_verdicts = false;
  for (const auto& [split, entries] : index.splits) {
    if (entries.empty()) continue;
    SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(dir, split, verify));
    for (const auto& shard : dataset.shards()) {
      ShardReport r = describe(*shard, split);
      r.checksum_checked = true;
      SY_RETURN_IF_ERROR(scan(*shard, r));
      report.shards.push_back(std::move(r));
    }
  }
  if (report.shards.empty())
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", kIndexFileName, ": lists no shards"));
  return absl::OkStatus();
}

// A lone shard; when the directory's index lists it, its checksum and counts too.
absl::Status inspect_shard(const std::string& path, InspectReport& report) {
  SY_ASSIGN_OR_RETURN(const std::shared_ptr<ShardReader> shard, ShardReader::open(path));
  const ShardAttributes& a = shard->attributes();
  report.format_version = a.format_version;
  report.tokenizer_sha256 = a.tokenizer_sha256;
  report.vocab_size = a.vocab_size;
  report.special_ids = a.special_ids;
  ShardReport r = describe(*shard, "");
  const fs::path dir = fs::path(path).parent_path();
  const std::string name = fs::path(path).filename().string();
  if (fs::exists(dir / kIndexFileName)) {
    SY_ASSIGN_OR_RETURN(const DatasetIndex index,
                        read_dataset_index(dir.empty() ? "." : dir.string()));
    for (const auto& [split, entries] : index.splits)
      for (const ShardEntry& e : entries) {
        if (e.file != name) continue;
        SY_ASSIGN_OR_RETURN(const std::string sha, sha256_file(path));
        if (sha != e.sha256 || r.bytes != e.bytes)
          return absl::DataLossError(absl::StrCat(path, ": sha256 ", sha, " (", r.bytes,
                                                  " bytes) does not match the index (", e.sha256,
                                                  ", ", e.bytes, " bytes)"));
        r.split = split;
        r.checksum_checked = true;
      }
  }
  SY_RETURN_IF_ERROR(scan(*shard, r));
  report.shards.push_back(std::move(r));
  return absl::OkStatus();
}

// The model named by the caller, or else the one the dataset keeps beside its shards.
absl::StatusOr<std::string> sample_tokenizer_path(const std::string& path, bool is_directory,
                                                  const InspectOptions& options) {
  if (!options.tokenizer_path.empty()) return options.tokenizer_path;
  const fs::path dir = is_directory ? fs::path(path) : fs::path(path).parent_path();
  if (!fs::exists(dir / kIndexFileName)) return std::string();
  SY_ASSIGN_OR_RETURN(const DatasetIndex index,
                      read_dataset_index(dir.empty() ? "." : dir.string()));
  if (index.tokenizer_file.empty()) return std::string();
  const std::string index_dir = dir.empty() ? "." : dir.string();
  return path_in_directory(
      index_dir, index.tokenizer_file,
      (fs::path(index_dir) / kIndexFileName).string() + ": field tokenizer_file");
}

// Decodes with the document boundaries visible: eos and bos decode to nothing.
absl::StatusOr<std::string> decode_sample(const Tokenizer& tokenizer,
                                          absl::Span<const int32_t> ids) {
  const SpecialTokenIds special = tokenizer.special_ids();
  std::string text;
  size_t begin = 0;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const bool end = i == ids.size();
    if (!end && ids[i] != special.eos && ids[i] != special.bos) continue;
    SY_ASSIGN_OR_RETURN(const std::string part, tokenizer.decode(ids.subspan(begin, i - begin)));
    text += part;
    if (!end) text += ids[i] == special.eos ? "[eos]" : "[bos]";
    begin = i + 1;
  }
  return text;
}

}  // namespace

absl::StatusOr<InspectReport> inspect_token_data(const std::string& path,
                                                 const InspectOptions& options) {
  InspectReport report;
  report.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return absl::NotFoundError(absl::StrCat(path, ": no such dataset directory or shard"));
  if (fs::is_directory(path, ec)) {
    SY_RETURN_IF_ERROR(inspect_directory(path, report));
  } else {
    SY_RETURN_IF_ERROR(inspect_shard(path, report));
  }

  const ShardReport& first = report.shards.front();
  SY_ASSIGN_OR_RETURN(const std::shared_ptr<ShardReader> shard, ShardReader::open(first.path));
  report.sample_ids.resize(static_cast<size_t>(std::min(options.sample_tokens, first.tokens)));
  SY_RETURN_IF_ERROR(shard->read_tokens(0, static_cast<int64_t>(report.sample_ids.size()),
                                        report.sample_ids.data()));
  SY_ASSIGN_OR_RETURN(const std::string tokenizer_path,
                      sample_tokenizer_path(path, report.is_directory, options));
  if (!tokenizer_path.empty()) {
    SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
    if (tokenizer.sha256() != report.tokenizer_sha256)
      return absl::FailedPreconditionError(absl::StrCat(
          tokenizer_path, ": sha256 ", tokenizer.sha256(),
          " is not the tokenizer the data was made with (", report.tokenizer_sha256, ")"));
    SY_ASSIGN_OR_RETURN(report.sample, decode_sample(tokenizer, report.sample_ids));
    report.sample_tokenizer = tokenizer_path;
  }
  return report;
}

}  // namespace switchyard
