// Helpers for the data tests: scratch directories, the bundled corpus and a small
// tokenizer trained once per test binary on a slice of it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "data/dataset_index.h"
#include "data/sha256.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard::testing {

namespace fs = std::filesystem;

inline const fs::path kRepoRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();
inline const fs::path kCorpusPath = kRepoRoot / "data/corpus/tinyshakespeare.txt";

// A fresh directory removed when the object goes.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "switchyard-data-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The first `bytes` of the bundled corpus, cut at a paragraph end.
inline std::string corpus_slice(size_t bytes) {
  std::string text = read_text(kCorpusPath.string());
  const size_t cut = text.rfind("\n\n", bytes);
  text.resize(cut + 1);
  return text;
}

// A 512-piece BPE tokenizer trained on 150 kB of the corpus, shared by a test binary.
inline const std::string& small_tokenizer_path() {
  static ScratchDir* dir = new ScratchDir();
  static const std::string path = [] {
    const std::string text_path = *dir / "slice.txt";
    write_text(text_path, corpus_slice(150'000));
    TokenizerTrainOptions options;
    options.inputs = {text_path};
    options.vocab_size = 512;
    DataProgressSink quiet;
    const absl::Status status = train_tokenizer(options, *dir / "tok.model", quiet);
    if (!status.ok()) ADD_FAILURE() << status;
    return *dir / "tok.model";
  }();
  return path;
}

// A dataset written without a tokenizer: token i of a split's stream has id
// (first_id + i) % vocab, so a window's ids tell where it came from. Documents are 50
// tokens long.
inline void write_position_dataset(const std::string& dir,
                                   const std::vector<int64_t>& train_shard_tokens,
                                   const std::vector<int64_t>& val_shard_tokens,
                                   int64_t vocab_size = 1 << 20, int64_t first_id = 0) {
  fs::create_directories(dir);
  DatasetIndex index;
  index.format_version = kTokenFormatVersion;
  index.tokenizer_sha256 = "position-ids";
  index.vocab_size = vocab_size;
  ShardAttributes attributes;
  attributes.tokenizer_sha256 = index.tokenizer_sha256;
  attributes.vocab_size = vocab_size;
  for (const auto& [split, sizes] :
       {std::pair{"train", train_shard_tokens}, std::pair{"val", val_shard_tokens}}) {
    int64_t position = first_id;
    for (size_t s = 0; s < sizes.size(); ++s) {
      ShardEntry entry;
      entry.file =
          shard_file_name(split, static_cast<int64_t>(s), static_cast<int64_t>(sizes.size()));
      const std::string path = (fs::path(dir) / entry.file).string();
      auto writer = ShardWriter::create(path, attributes);
      EXPECT_TRUE(writer.ok()) << writer.status();
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < sizes[s]; ++i) {
        ids.push_back(static_cast<int32_t>(position++ % vocab_size));
        if (ids.size() == 50 || i + 1 == sizes[s]) {
          EXPECT_TRUE(
              (*writer)->append_document(ids.data(), static_cast<int64_t>(ids.size())).ok());
          ids.clear();
        }
      }
      entry.tokens = (*writer)->num_tokens();
      entry.documents = (*writer)->num_documents();
      EXPECT_TRUE((*writer)->close().ok());
      entry.bytes = static_cast<int64_t>(fs::file_size(path));
      entry.sha256 = *sha256_file(path);
      index.splits[split].push_back(entry);
    }
  }
  EXPECT_TRUE(write_dataset_index(dir, index).ok());
}

// Overwrites bytes at `offset` (negative: from the end) of a file.
inline void patch_file(const std::string& path, int64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (offset < 0) {
    f.seekp(0, std::ios::end);
    offset += static_cast<int64_t>(f.tellp());
  }
  f.seekp(offset);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Offset of the first occurrence of `needle` in the file.
inline int64_t find_in_file(const std::string& path, const std::string& needle) {
  const std::string text = read_text(path);
  const size_t at = text.find(needle);
  return at == std::string::npos ? -1 : static_cast<int64_t>(at);
}

inline std::string message_of(const absl::Status& status) { return std::string(status.message()); }

// Plain gtest (no gmock): `text` contains `part`, and is one line.
inline ::testing::AssertionResult IsOneLineWith(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos)
    return ::testing::AssertionFailure() << "\"" << text << "\" lacks \"" << part << "\"";
  if (text.find('\n') != std::string::npos)
    return ::testing::AssertionFailure() << "\"" << text << "\" spans several lines";
  return ::testing::AssertionSuccess();
}

}  // namespace switchyard::testing
