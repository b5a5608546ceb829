// `data prepare`: the shards hold exactly the encoded documents with eos between them,
// split into train and val as documented; bad input is one clear error and leaves no
// shard or index behind; opening checks shards against the index and the caller.
#include "data/prepare.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "data/dataset_index.h"
#include "data/document_reader.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;
using ::switchyard::testing::small_tokenizer_path;
using ::switchyard::testing::write_text;

// The documented stream: documents in order, each encoded and followed by eos; document
// i goes to val when floor((i + 1) f) > floor(i f).
void expected_streams(const std::vector<std::string>& inputs, double f, std::vector<int32_t>* train,
                      std::vector<int32_t>* val, int64_t* documents) {
  const Tokenizer tok = *Tokenizer::load(small_tokenizer_path());
  *documents = 0;
  for (const std::string& input : inputs) {
    auto reader = *DocumentReader::open(input, "text");
    std::string doc;
    while (*reader->next(&doc)) {
      const int64_t i = (*documents)++;
      const bool is_val = static_cast<int64_t>((i + 1) * f) > static_cast<int64_t>(i * f);
      std::vector<int32_t>* out = is_val ? val : train;
      tok.encode_append(doc, out);
      out->push_back(static_cast<int32_t>(tok.special_ids().eos));
    }
  }
}

std::vector<int32_t> read_all(const TokenDataset& d) {
  std::vector<int32_t> ids(static_cast<size_t>(d.num_tokens()));
  EXPECT_TRUE(d.read_tokens(0, d.num_tokens(), ids.data()).ok());
  return ids;
}

DatasetOpenOptions expect_vocab(int64_t vocab_size) {
  DatasetOpenOptions o;
  o.expected_vocab_size = vocab_size;
  return o;
}
DatasetOpenOptions expect_tokenizer(const std::string& sha256) {
  DatasetOpenOptions o;
  o.expected_tokenizer_sha256 = sha256;
  return o;
}

bool has_leftovers(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".h5") || name.ends_with(".partial") || name == "index.json" ||
        name.starts_with("part-"))
      return true;
  }
  return false;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    text_path_ = dir_ / "shakespeare.txt";
    write_text(text_path_, testing::corpus_slice(120'000));
    options_.tokenizer_path = small_tokenizer_path();
    options_.inputs = {text_path_};
    options_.out_dir = dir_ / "dataset";
    options_.val_fraction = 0.1;
    options_.shard_tokens = 8000;
  }
  ScratchDir dir_;
  std::string text_path_;
  PrepareOptions options_;
  DataProgressSink quiet_;
};

TEST_F(PrepareTest, ShardsHoldTheEncodedStream) {
  auto summary = prepare_dataset(options_, quiet_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  std::vector<int32_t> train, val;
  int64_t documents;
  expected_streams(options_.inputs, 0.1, &train, &val, &documents);
  EXPECT_EQ(summary->documents[0] + summary->documents[1], documents);
  EXPECT_EQ(summary->documents[1], documents / 10);
  EXPECT_GT(summary->shards[0], 3);  // 8000-token shards

  auto train_set = TokenDataset::open(options_.out_dir, "train");
  ASSERT_TRUE(train_set.ok()) << train_set.status();
  auto val_set = TokenDataset::open(options_.out_dir, "val");
  ASSERT_TRUE(val_set.ok()) << val_set.status();
  EXPECT_EQ(read_all(*train_set), train);
  EXPECT_EQ(read_all(*val_set), val);

  // One epoch of loader windows, put back in stream order, is the encoded stream.
  LoaderOptions lo;
  lo.seq_len = 64;
  lo.global_batch = 10;
  auto loader = Loader::create(*train_set, lo);
  ASSERT_TRUE(loader.ok()) << loader.status();
  const int64_t windows = (*loader)->windows_per_epoch();
  std::vector<int32_t> ids(windows * 64), targets(windows * 64);
  ASSERT_TRUE((*loader)->next_batch(windows, ids.data(), targets.data()).ok());
  const std::vector<int64_t> order = epoch_permutation(lo.seed, 0, windows);
  std::vector<int32_t> rebuilt(windows * 64 + 1);
  for (int64_t i = 0; i < windows; ++i) {
    std::copy_n(ids.begin() + i * 64, 64, rebuilt.begin() + order[i] * 64);
    rebuilt[order[i] * 64 + 64] = targets[i * 64 + 63];
  }
  EXPECT_TRUE(std::equal(rebuilt.begin(), rebuilt.end(), train.begin()));
  EXPECT_EQ(train_set->num_documents(), summary->documents[0]);
  EXPECT_EQ(train_set->vocab_size(), 512);
  EXPECT_EQ(train_set->special_ids(), kTrainedSpecialIds);
  EXPECT_EQ(train_set->shards()[0]->dtype(), TokenDType::kUint16);

  // The kept tokenizer decodes the first document back to the first paragraph.
  const Tokenizer tok = *Tokenizer::load(train_set->tokenizer_path());
  EXPECT_EQ(tok.sha256(), train_set->tokenizer_sha256());
  const auto eos = std::find(train.begin(), train.end(), 2);
  EXPECT_EQ(*tok.decode(std::vector<int32_t>(train.begin(), eos)),
            "First Citizen:\nBefore we proceed any further, hear me speak.");

  // No temporary file is left.
  for (const auto& entry : fs::directory_iterator(options_.out_dir))
    EXPECT_FALSE(entry.path().filename().string().starts_with(".")) << entry.path();
  const DatasetIndex index = *read_dataset_index(options_.out_dir);
  EXPECT_EQ(index.splits.at("train").front().file, shard_file_name("train", 0, summary->shards[0]));
}

TEST_F(PrepareTest, ReadsJsonLinesAndGzip) {
  const std::string jsonl = dir_ / "docs.jsonl";
  write_text(jsonl,
             "{\"text\": \"To be, or not to be\", \"id\": 1}\n\n"
             "{\"id\": 2, \"text\": \"caf\\u00e9 \\n line two\"}\n");
  ASSERT_EQ(std::system(("gzip -k " + jsonl + " && gzip -k " + text_path_).c_str()), 0);
  options_.inputs = {jsonl + ".gz", text_path_ + ".gz"};
  options_.val_fraction = 0;
  auto summary = prepare_dataset(options_, quiet_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  std::vector<int32_t> train, val;
  int64_t documents;
  expected_streams({jsonl, text_path_}, 0, &train, &val, &documents);
  EXPECT_TRUE(val.empty());
  EXPECT_EQ(summary->documents[1], 0);
  EXPECT_EQ(read_all(*TokenDataset::open(options_.out_dir, "train")), train);
  const Tokenizer tok = *Tokenizer::load(small_tokenizer_path());
  const auto first_eos = std::find(train.begin(), train.end(), 2);
  EXPECT_EQ(*tok.decode(std::vector<int32_t>(train.begin(), first_eos)), "To be, or not to be");
  EXPECT_TRUE(IsOneLineWith(message_of(TokenDataset::open(options_.out_dir, "val").status()),
                            "has no val shards"));
}

TEST_F(PrepareTest, BadInputIsOneErrorAndLeavesNothing) {
  write_text(dir_ / "empty.txt", "\n\n\n");
  write_text(dir_ / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n");
  write_text(dir_ / "not.model", "I am not a tokenizer");
  write_text(dir_ / "truncated.txt.gz", "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x2b\x49");
  struct Case {
    std::vector<std::string> inputs;
    std::string tokenizer;
    std::string want;
  };
  const Case cases[] = {
      {{dir_ / "missing.txt"}, small_tokenizer_path(), dir_ / "missing.txt"},
      {{text_path_, dir_ / "empty.txt"}, small_tokenizer_path(), dir_ / "empty.txt: holds no text"},
      {{dir_ / "bad.jsonl"},
       small_tokenizer_path(),
       dir_ / "bad.jsonl:2: no string field \"text\""},
      {{dir_ / "truncated.txt.gz"}, small_tokenizer_path(), dir_ / "truncated.txt.gz"},
      {{text_path_}, dir_ / "not.model", dir_ / "not.model: not a SentencePiece model"},
      {{text_path_}, dir_ / "no.model", dir_ / "no.model"},
      {{}, small_tokenizer_path(), "no input files"},
  };
  for (const Case& c : cases) {
    options_.inputs = c.inputs;
    options_.tokenizer_path = c.tokenizer;
    EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()), c.want));
    if (fs::exists(options_.out_dir)) {
      EXPECT_FALSE(has_leftovers(options_.out_dir)) << c.want;
    }
  }
  options_.inputs = {text_path_};
  options_.tokenizer_path = small_tokenizer_path();
  options_.val_fraction = 1.5;
  EXPECT_TRUE(
      IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()), "--val-fraction"));
  options_.val_fraction = 0.1;
  ASSERT_TRUE(prepare_dataset(options_, quiet_).ok());
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()),
                            "already holds a dataset"));
}

TEST_F(PrepareTest, OpeningChecksShardsAgainstIndexAndCaller) {
  ASSERT_TRUE(prepare_dataset(options_, quiet_).ok());
  const std::string dir = options_.out_dir;
  const DatasetIndex index = *read_dataset_index(dir);
  const std::string shard = (fs::path(dir) / index.splits.at("train")[1].file).string();
  const std::string good = testing::read_text(shard);

  // The caller expects another tokenizer or vocabulary.
  EXPECT_TRUE(
      IsOneLineWith(message_of(TokenDataset::open(dir, "train", expect_tokenizer("abc")).status()),
                    dir + "/index.json: the dataset was made with tokenizer sha256"));
  EXPECT_TRUE(
      IsOneLineWith(message_of(TokenDataset::open(dir, "train", expect_vocab(32000)).status()),
                    "has vocab_size 512, not the expected 32000"));

  // Same size, other bytes in the token stream (the middle of the file): only the
  // checksum sees it.
  const int64_t offset = static_cast<int64_t>(good.size()) / 2;
  testing::patch_file(shard, offset, std::string(1, static_cast<char>(good[offset] ^ 0x5a)));
  DatasetOpenOptions unverified;
  unverified.verify_checksums = false;
  EXPECT_TRUE(TokenDataset::open(dir, "train", unverified).ok());
  EXPECT_TRUE(
      IsOneLineWith(message_of(TokenDataset::open(dir, "train").status()), shard + ": sha256"));

  // Truncated.
  write_text(shard, good.substr(0, good.size() - 1000));
  EXPECT_TRUE(IsOneLineWith(message_of(TokenDataset::open(dir, "train").status()),
                            shard + ": is " + std::to_string(good.size() - 1000) + " bytes"));

  // A shard from another tokenizer / vocabulary than the index says.
  write_text(shard, good);
  std::string index_text = testing::read_text(dir + "/index.json");
  const std::string sha = index.tokenizer_sha256;
  std::string other_sha = index_text;
  other_sha.replace(other_sha.find(sha), sha.size(), std::string(64, 'f'));
  write_text(dir + "/index.json", other_sha);
  EXPECT_TRUE(
      IsOneLineWith(message_of(TokenDataset::open(dir, "train").status()),
                    "tokenizer.model: sha256 " + sha + " is not the index's tokenizer_sha256"));
  std::string other_vocab = index_text;
  other_vocab.replace(other_vocab.find("\"vocab_size\": 512"), 17, "\"vocab_size\": 999");
  write_text(dir + "/index.json", other_vocab);
  EXPECT_TRUE(IsOneLineWith(message_of(TokenDataset::open(dir, "train").status()),
                            "tokenizer.model: has 512 pieces, the index's vocab_size is 999"));
  write_text(dir + "/index.json", "{\"format\": \"switchyard-tokens\"");
  EXPECT_TRUE(IsOneLineWith(message_of(TokenDataset::open(dir, "train").status()),
                            dir + "/index.json: not a JSON object"));
  EXPECT_TRUE(IsOneLineWith(message_of(TokenDataset::open(dir_ / "nothing", "train").status()),
                            dir_ / "nothing"));
}

}  // namespace
}  // namespace switchyard
