// `inspect` on a dataset directory and on one shard: counts, a decoded sample, and full
// validation that reports the first damage as one line naming the file.
#include "data/inspect.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "data/dataset_index.h"
#include "data/prepare.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_text(dir_ / "in.txt", testing::corpus_slice(40'000));
    PrepareOptions o;
    o.tokenizer_path = testing::small_tokenizer_path();
    o.inputs = {dir_ / "in.txt"};
    o.out_dir = dataset_ = dir_ / "dataset";
    o.val_fraction = 0.2;
    o.shard_tokens = 5000;
    DataProgressSink quiet;
    ASSERT_TRUE(prepare_dataset(o, quiet).ok());
    index_ = *read_dataset_index(dataset_);
  }
  std::string shard(const std::string& split, int i) const {
    return (fs::path(dataset_) / index_.splits.at(split)[i].file).string();
  }
  ScratchDir dir_;
  std::string dataset_;
  DatasetIndex index_;
};

TEST_F(InspectTest, DescribesADatasetDirectory) {
  auto report = inspect_token_data(dataset_, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->is_directory);
  EXPECT_EQ(report->vocab_size, 512);
  EXPECT_EQ(report->special_ids, kTrainedSpecialIds);
  EXPECT_EQ(report->shards.size(),
            index_.splits.at("train").size() + index_.splits.at("val").size());
  int64_t tokens = 0;
  for (const ShardReport& s : report->shards) {
    EXPECT_TRUE(s.checksum_checked);
    EXPECT_EQ(s.dtype, TokenDType::kUint16);
    EXPECT_GT(s.max_token_id, 259);  // learned pieces, not only bytes
    EXPECT_LT(s.max_token_id, 512);
    tokens += s.tokens;
  }
  EXPECT_GT(tokens, 5000);
  EXPECT_EQ(report->sample_tokenizer, dataset_ + "/tokenizer.model");
  EXPECT_EQ(report->sample.rfind("First Citizen:\nBefore we proceed", 0), 0u) << report->sample;
}

TEST_F(InspectTest, DescribesOneShard) {
  auto report = inspect_token_data(shard("val", 0), {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->is_directory);
  ASSERT_EQ(report->shards.size(), 1u);
  EXPECT_EQ(report->shards[0].split, "val");
  EXPECT_TRUE(report->shards[0].checksum_checked);
  EXPECT_FALSE(report->sample.empty());

  // Outside its directory there is no index to check against and no kept tokenizer,
  // unless one is named.
  fs::copy_file(shard("val", 0), dir_ / "lone.h5");
  report = inspect_token_data(dir_ / "lone.h5", {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->shards[0].checksum_checked);
  EXPECT_TRUE(report->sample.empty());
  EXPECT_EQ(report->sample_ids.size(), 64u);
  InspectOptions with_tokenizer;
  with_tokenizer.tokenizer_path = testing::small_tokenizer_path();
  report = inspect_token_data(dir_ / "lone.h5", with_tokenizer);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->sample.empty());
}

TEST_F(InspectTest, ReportsDamageNamingTheFile) {
  const std::string target = shard("train", 1);
  const std::string good = testing::read_text(target);
  // A byte of the token stream (the middle of the file), which only the checksum sees.
  testing::patch_file(target, static_cast<int64_t>(good.size() / 2), "x");
  EXPECT_TRUE(
      IsOneLineWith(message_of(inspect_token_data(dataset_, {}).status()), target + ": sha256"));
  EXPECT_TRUE(
      IsOneLineWith(message_of(inspect_token_data(target, {}).status()), target + ": sha256"));
  testing::write_text(target, good.substr(0, 3000));
  EXPECT_TRUE(IsOneLineWith(message_of(inspect_token_data(dataset_, {}).status()), target));
  testing::write_text(target, good);

  testing::write_text(dir_ / "other.model",
                      testing::read_text(testing::small_tokenizer_path()) + "x");
  InspectOptions wrong;
  wrong.tokenizer_path = dir_ / "other.model";
  EXPECT_TRUE(IsOneLineWith(message_of(inspect_token_data(dataset_, wrong).status()),
                            dir_ / "other.model"));
  EXPECT_TRUE(
      IsOneLineWith(message_of(inspect_token_data(dir_ / "nope", {}).status()), dir_ / "nope"));
}

}  // namespace
}  // namespace switchyard
