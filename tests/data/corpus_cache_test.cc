// ensure_prepared_corpus: the first call trains a tokenizer and prepares the corpus, a
// second returns the cached directory; the result depends only on the corpus bytes and
// the settings.
#include "data/corpus_cache.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

class CountingSink : public DataProgressSink {
 public:
  void on_message(const std::string& text) override { ++messages; }
  int messages = 0;
};

TEST(CorpusCacheTest, PreparesOnceThenReuses) {
  ScratchDir dir;
  testing::write_text(dir / "corpus.txt", testing::corpus_slice(100'000));
  CorpusDatasetOptions options;
  options.vocab_size = 400;
  options.cache_dir = dir / "cache";
  CountingSink sink;
  auto first = ensure_prepared_corpus(dir / "corpus.txt", options, sink);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GT(sink.messages, 0);
  EXPECT_EQ(fs::path(*first).parent_path(), fs::path(options.cache_dir));
  EXPECT_TRUE(fs::path(*first).filename().string().starts_with("corpus-v400-"));
  auto train = TokenDataset::open(*first, "train");
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->vocab_size(), 400);
  EXPECT_TRUE(TokenDataset::open(*first, "val").ok());
  // Only the finished dataset is in the cache: no temporary directory is left.
  EXPECT_EQ(std::distance(fs::directory_iterator(options.cache_dir), fs::directory_iterator()), 1);

  CountingSink again;
  auto second = ensure_prepared_corpus(dir / "corpus.txt", options, again);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(again.messages, 0);

  // Elsewhere, the same inputs give the same tokenizer and tokens.
  options.cache_dir = dir / "cache2";
  auto fresh = ensure_prepared_corpus(dir / "corpus.txt", options, sink);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fs::path(*fresh).filename(), fs::path(*first).filename());
  auto fresh_train = TokenDataset::open(*fresh, "train");
  ASSERT_TRUE(fresh_train.ok());
  EXPECT_EQ(fresh_train->tokenizer_sha256(), train->tokenizer_sha256());
  ASSERT_EQ(fresh_train->num_tokens(), train->num_tokens());
  std::vector<int32_t> a(train->num_tokens()), b(train->num_tokens());
  ASSERT_TRUE(train->read_tokens(0, train->num_tokens(), a.data()).ok());
  ASSERT_TRUE(fresh_train->read_tokens(0, train->num_tokens(), b.data()).ok());
  EXPECT_EQ(a, b);

  // Other settings, other directory.
  options.vocab_size = 420;
  auto other = ensure_prepared_corpus(dir / "corpus.txt", options, sink);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(fs::path(*other).filename(), fs::path(*first).filename());
}

TEST(CorpusCacheTest, BadCorpusIsAnError) {
  ScratchDir dir;
  CorpusDatasetOptions options;
  options.vocab_size = 400;
  options.cache_dir = dir / "cache";
  DataProgressSink quiet;
  EXPECT_TRUE(IsOneLineWith(
      message_of(ensure_prepared_corpus(dir / "missing.txt", options, quiet).status()),
      dir / "missing.txt"));
  testing::write_text(dir / "empty.txt", "");
  EXPECT_TRUE(
      IsOneLineWith(message_of(ensure_prepared_corpus(dir / "empty.txt", options, quiet).status()),
                    dir / "empty.txt: the corpus is empty"));
}

}  // namespace
}  // namespace switchyard
