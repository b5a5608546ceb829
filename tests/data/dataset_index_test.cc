// A dataset directory's index is untrusted: names must stay inside the directory, counts
// must agree, and shards are verified against its sha256 digests, a match being
// remembered only for the unchanged file.
#include "data/dataset_index.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>

#include "data/checksum_verdicts.h"
#include "data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::read_text;
using ::switchyard::testing::ScratchDir;
using ::switchyard::testing::write_text;

constexpr char kShard[] = "train-00000-of-00001.h5";

class DatasetIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Verdicts go to this test's own cache.
    setenv("SWITCHYARD_CACHE_DIR", (cache_.path() / "cache").c_str(), 1);
    testing::write_position_dataset(dir(), {3000}, {}, 1000);
    index_ = read_text(index_path());
  }
  std::string dir() const { return (scratch_.path() / "dataset").string(); }
  std::string index_path() const { return dir() + "/index.json"; }
  std::string open_error() const { return message_of(TokenDataset::open(dir(), "train").status()); }
  // The index with its first occurrence of `from` replaced.
  void edit_index(const std::string& from, const std::string& to) {
    std::string text = index_;
    text.replace(text.find(from), from.size(), to);
    write_text(index_path(), text);
  }

  ScratchDir scratch_, cache_;
  std::string index_;
};

TEST_F(DatasetIndexTest, ShardNamesStayInsideTheDirectory) {
  write_text((scratch_.path() / "outside.h5").string(), read_text(dir() + "/" + kShard));
  edit_index(kShard, "../outside.h5");
  EXPECT_TRUE(IsOneLineWith(open_error(), "splits.train[0].file \"../outside.h5\" is not a plain"));
  edit_index(kShard, (scratch_.path() / "outside.h5").string());
  EXPECT_TRUE(IsOneLineWith(open_error(), "is not a plain file name"));
  fs::create_symlink(scratch_.path() / "outside.h5", dir() + "/link.h5");
  edit_index(kShard, "link.h5");
  EXPECT_TRUE(IsOneLineWith(open_error(), "\"link.h5\" leads outside"));
  ASSERT_EQ(mkfifo((dir() + "/fifo.h5").c_str(), 0600), 0);
  edit_index(kShard, "fifo.h5");
  EXPECT_TRUE(IsOneLineWith(open_error(), "fifo.h5: is not a regular file"));
  edit_index("\"tokenizer_sha256\"", "\"tokenizer_file\": \"../index.json\", \"tokenizer_sha256\"");
  EXPECT_TRUE(IsOneLineWith(open_error(), "field tokenizer_file \"../index.json\""));
}

TEST_F(DatasetIndexTest, CountsAndDigestsMustBeConsistent) {
  edit_index("\"documents\": 60", "\"documents\": 3001");
  EXPECT_TRUE(IsOneLineWith(open_error(),
                            "field splits.train[0].documents must be an integer in [0, 3000]"));
  edit_index("\"tokens\": 3000", "\"tokens\": -5");
  EXPECT_TRUE(IsOneLineWith(open_error(), "field splits.train[0].tokens must be"));
  edit_index("\"sha256\": \"", "\"sha256\": \"../");
  EXPECT_TRUE(
      IsOneLineWith(open_error(), "field splits.train[0].sha256 must be 64 lower-case hex"));
  const size_t start = index_.find('{', index_.find("\"train\""));
  const std::string entry = index_.substr(start, index_.find('}', start) + 1 - start);
  edit_index(entry, entry + ", " + entry);
  EXPECT_TRUE(IsOneLineWith(open_error(), "field splits.train[1].file lists \"" +
                                              std::string(kShard) +
                                              "\" again (splits.train[0].file)"));
  edit_index("\"pad\": -1", "\"pad\": 1000");
  EXPECT_TRUE(IsOneLineWith(open_error(), "field special_ids.pad must be an integer in [-1, 999]"));
}

TEST_F(DatasetIndexTest, ChecksumVerdictsCoverOnlyTheUnchangedFile) {
  const std::string shard = dir() + "/" + kShard;
  ASSERT_TRUE(TokenDataset::open(dir(), "train").ok());
  const fs::path verdicts = default_verdict_cache_dir();
  ASSERT_EQ(std::distance(fs::directory_iterator(verdicts), fs::directory_iterator()), 1);
  // The same bytes rewritten: a new version, hashed again (and still good).
  write_text(shard, read_text(shard));
  ASSERT_TRUE(TokenDataset::open(dir(), "train").ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(verdicts), fs::directory_iterator()), 2);
  // One flipped byte with the old modification time: the ctime still differs.
  const auto mtime = fs::last_write_time(shard);
  std::string bytes = read_text(shard);
  bytes[bytes.size() - 100] ^= 0x5a;
  write_text(shard, bytes);
  fs::last_write_time(shard, mtime);
  EXPECT_TRUE(IsOneLineWith(open_error(), shard + ": sha256"));
}

}  // namespace
}  // namespace switchyard
