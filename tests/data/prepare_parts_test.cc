// `data prepare` resumed and in parts: a prepare killed after some shards, run again,
// continues after them and makes the bytes of an uninterrupted run; changed arguments or
// inputs are refused. Parts made separately and merged hold the token streams of a
// one-process prepare; a missing part, one from other arguments, a swapped record or
// shard are refused in one line.
#include "data/prepare_parts.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "data/prepare.h"
#include "data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::read_text;
using ::switchyard::testing::ScratchDir;
using ::switchyard::testing::small_tokenizer_path;
using ::switchyard::testing::write_text;

constexpr int kKilled = 42;

// Ends the process, as a kill would, once the part has recorded a complete shard.
class KillingSink : public DataProgressSink {
 public:
  explicit KillingSink(std::string record) : record_(std::move(record)) {}
  void on_progress(const DataProgress& progress) override {
    if (std::string(progress.stage) == "prepare" && fs::exists(record_)) std::_Exit(kKilled);
  }

 private:
  std::string record_;
};

class RecordingSink : public DataProgressSink {
 public:
  void on_message(const std::string& text) override { messages += text + "\n"; }
  std::string messages;
};

// Every file of a directory (hidden ones too) by name.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    files[entry.path().filename().string()] = read_text(entry.path().string());
  return files;
}

std::vector<int32_t> tokens_of(const std::string& dir, const std::string& split) {
  auto dataset = TokenDataset::open(dir, split, {});
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int32_t> ids(static_cast<size_t>(dataset->num_tokens()));
  EXPECT_TRUE(dataset->read_tokens(0, dataset->num_tokens(), ids.data()).ok());
  return ids;
}

class PreparePartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three inputs; together more than three encoding batches (1 MiB each).
    const std::string corpus = testing::corpus_slice(1'200'000);
    for (const char* name : {"a.txt", "b.txt", "c.txt"}) {
      inputs_.push_back(dir_ / name);
      write_text(inputs_.back(), corpus);
    }
    options_.tokenizer_path = small_tokenizer_path();
    options_.inputs = inputs_;
    options_.val_fraction = 0.05;
    options_.shard_tokens = 60'000;
    options_.threads = 2;
  }

  // Runs `options` in a child process killed after its first complete shard.
  void prepare_killed(const PrepareOptions& options) {
    const std::string record =
        (fs::path(options.out_dir) / part_record_name(options.part.value_or(PartId{}))).string();
    EXPECT_EXIT(
        {
          KillingSink sink(record);
          const absl::Status status = prepare_dataset(options, sink).status();
          std::fprintf(stderr, "not killed: %s\n", status.ToString().c_str());
          std::_Exit(1);
        },
        ::testing::ExitedWithCode(kKilled), "");
  }

  PrepareOptions with_out(const std::string& name) const {
    PrepareOptions options = options_;
    options.out_dir = dir_ / name;
    return options;
  }

  ScratchDir dir_;
  std::vector<std::string> inputs_;
  PrepareOptions options_;
  DataProgressSink quiet_;
};

TEST_F(PreparePartsTest, KilledPrepareResumesToTheSameBytes) {
  const PrepareOptions whole = with_out("whole");
  ASSERT_TRUE(prepare_dataset(whole, quiet_).ok());

  const PrepareOptions resumed = with_out("resumed");
  prepare_killed(resumed);
  EXPECT_FALSE(fs::exists(fs::path(resumed.out_dir) / "index.json"));
  RecordingSink sink;
  auto summary = prepare_dataset(resumed, sink);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GE(summary->shards_resumed, 1);
  EXPECT_NE(sink.messages.find("resuming"), std::string::npos) << sink.messages;
  EXPECT_NE(sink.messages.find("shards complete"), std::string::npos) << sink.messages;
  // Same files (no part record, no hidden shard left), same bytes.
  const auto want = files_of(whole.out_dir);
  const auto got = files_of(resumed.out_dir);
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  }
  EXPECT_EQ(got.size(), want.size());
}

TEST_F(PreparePartsTest, ResumeRefusesChangedArgumentsInputsAndShards) {
  PrepareOptions options = with_out("killed");
  prepare_killed(options);
  const fs::path record = fs::path(options.out_dir) / "part-00000-of-00001.json";
  ASSERT_TRUE(fs::exists(record));

  PrepareOptions other = options;
  other.shard_tokens = 70'000;
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(other, quiet_).status()),
                            "a prepare made with other arguments"));
  other = options;
  other.val_fraction = 0.1;
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(other, quiet_).status()), "to start over"));
  // A changed input (its size and mtime).
  write_text(inputs_[2], read_text(inputs_[2]) + "\nOne more line.\n");
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options, quiet_).status()),
                            "or inputs (changed since)"));
  EXPECT_TRUE(fs::exists(record)) << "a refusal keeps the earlier run's work";

  // A damaged complete shard.
  PrepareOptions fresh = with_out("damaged");
  prepare_killed(fresh);
  const fs::path shard = fs::path(fresh.out_dir) / part_shard_name(PartId{}, 0, 0);
  ASSERT_TRUE(fs::exists(shard));
  testing::patch_file(shard.string(), static_cast<int64_t>(fs::file_size(shard)) - 8, "XXXXXXXX");
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(fresh, quiet_).status()),
                            "not the shard part-00000-of-00001.json records"));
}

TEST_F(PreparePartsTest, PartsMergeIntoTheStreamsOfOneProcess) {
  const PrepareOptions whole = with_out("whole");
  ASSERT_TRUE(prepare_dataset(whole, quiet_).ok());
  for (const int64_t count : {2, 3}) {
    PrepareOptions parts = with_out(absl::StrCat("parts", count));
    for (int64_t i = count - 1; i >= 0; --i) {
      parts.part = PartId{i, count};
      auto part = prepare_dataset(parts, quiet_);
      ASSERT_TRUE(part.ok()) << part.status();
      EXPECT_FALSE(fs::exists(fs::path(parts.out_dir) / "index.json"));
    }
    // A part killed and run again resumes like a whole prepare.
    fs::remove(fs::path(parts.out_dir) / part_record_name(PartId{0, count}));
    parts.part = PartId{0, count};
    prepare_killed(parts);
    RecordingSink sink;
    ASSERT_TRUE(prepare_dataset(parts, sink).ok());
    EXPECT_NE(sink.messages.find("resuming"), std::string::npos);

    auto merged = merge_parts(parts.out_dir, quiet_);
    ASSERT_TRUE(merged.ok()) << merged.status();
    for (const char* split : {"train", "val"}) {
      EXPECT_EQ(tokens_of(parts.out_dir, split), tokens_of(whole.out_dir, split)) << split;
      auto a = TokenDataset::open(parts.out_dir, split, {});
      auto b = TokenDataset::open(whole.out_dir, split, {});
      EXPECT_EQ(a->num_documents(), b->num_documents()) << split;
    }
    EXPECT_EQ(read_text(parts.out_dir + "/tokenizer.model"),
              read_text(whole.out_dir + "/tokenizer.model"));
    for (const auto& [name, bytes] : files_of(parts.out_dir))
      EXPECT_FALSE(name.starts_with("part-") || name.starts_with(".part-")) << name;
  }
}

// Prepares the parts of 2 into `out`: `which` of them.
void prepare_parts(PrepareOptions options, const std::vector<int64_t>& which) {
  DataProgressSink quiet;
  for (const int64_t i : which) {
    options.part = PartId{i, 2};
    auto part = prepare_dataset(options, quiet);
    ASSERT_TRUE(part.ok()) << part.status();
  }
}

TEST_F(PreparePartsTest, MergeRefusesMissingForeignAndSwappedParts) {
  const auto merge_error = [&](const std::string& dir) {
    return message_of(merge_parts(dir, quiet_).status());
  };
  EXPECT_TRUE(IsOneLineWith(merge_error(dir_ / "nowhere"), "no such directory"));
  fs::create_directories(dir_ / "empty");
  EXPECT_TRUE(IsOneLineWith(merge_error(dir_ / "empty"), "holds no part records"));

  PrepareOptions options = with_out("parts");
  const fs::path dir = options.out_dir;
  const fs::path record0 = dir / "part-00000-of-00002.json";
  const fs::path record1 = dir / "part-00001-of-00002.json";
  prepare_parts(options, {0});
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "part-00001-of-00002.json: missing: part 1/2"));

  // Part 1 made with other arguments.
  PrepareOptions foreign = options;
  foreign.shard_tokens = 50'000;
  prepare_parts(foreign, {1});
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "made with other arguments"));
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options, quiet_).status()),
                            "holds the parts of a prepare split into 2"));
  options.part = PartId{1, 2};
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options, quiet_).status()),
                            "made with other arguments"));
  fs::remove(record1);
  prepare_parts(options, {1});

  // Swapped records and shards.
  const std::string record1_text = read_text(record1.string());
  fs::copy_file(record0, record1, fs::copy_options::overwrite_existing);
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "is the record of part 0/2, not of part 1/2"));
  write_text(record1.string(), record1_text);
  const fs::path shard0 = dir / part_shard_name(PartId{0, 2}, 0, 0);
  const fs::path shard1 = dir / part_shard_name(PartId{1, 2}, 0, 0);
  const fs::path aside = dir / "aside";
  fs::rename(shard0, aside);
  fs::rename(shard1, shard0);
  fs::rename(aside, shard1);
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "not the shard its part record lists"));
  fs::rename(shard0, aside);
  fs::rename(shard1, shard0);
  fs::rename(aside, shard1);

  // An edited or unfinished record.
  std::string text = read_text(record1.string());
  const std::string finished = "\"finished\": true";
  ASSERT_NE(text.find(finished), std::string::npos);
  write_text(record1.string(), std::string(text).replace(text.find(finished), finished.size(),
                                                         "\"finished\": false"));
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "part 1/2 has not finished"));
  const std::string fraction = "\"val_fraction\": 0.05";
  ASSERT_NE(text.find(fraction), std::string::npos);
  write_text(record1.string(), std::string(text).replace(text.find(fraction), fraction.size(),
                                                         "\"val_fraction\": 0.5"));
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "the record was edited"));
  write_text(record1.string(), text);

  // Parts of another split beside these.
  write_text((dir / "part-00000-of-00003.json").string(), "{}");
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "split into 2 and into 3"));
  fs::remove(dir / "part-00000-of-00003.json");

  // A merge interrupted after moving a shard to its dataset name is run again.
  const int64_t train_shards =
      static_cast<int64_t>(read_part_record(record0.string())->shards[0].size() +
                           read_part_record(record1.string())->shards[0].size());
  fs::rename(shard0, dir / shard_file_name("train", 0, train_shards));
  auto merged = merge_parts(dir, quiet_);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->shards[0], train_shards);
  EXPECT_TRUE(TokenDataset::open(dir, "train", {}).ok());
  EXPECT_TRUE(IsOneLineWith(merge_error(dir), "already holds a dataset"));
}

TEST_F(PreparePartsTest, PartOptionIsChecked) {
  EXPECT_EQ(parse_part_id("2/8")->index, 2);
  EXPECT_EQ(parse_part_id("2/8")->count, 8);
  for (const char* bad : {"8/8", "-1/2", "1", "a/2", "1/0", "0/100000", "1/2/3", " 1/2", "1/"})
    EXPECT_TRUE(IsOneLineWith(message_of(parse_part_id(bad).status()), "--part")) << bad;
  PrepareOptions options = with_out("four");
  options.part = PartId{0, 4};
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options, quiet_).status()),
                            "there are 3 input files; use at most 3 parts"));
  EXPECT_EQ(part_inputs(3, PartId{0, 2}), std::make_pair(size_t{0}, size_t{1}));
  EXPECT_EQ(part_inputs(3, PartId{1, 2}), std::make_pair(size_t{1}, size_t{3}));
}

}  // namespace
}  // namespace switchyard
