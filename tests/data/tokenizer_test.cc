// SentencePiece training, encoding and decoding: every byte string survives the round
// trip (byte fallback), the special ids are the documented ones, bad files are errors.
#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "core/config/recipe.h"
#include "data/sha256.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::read_text;
using ::switchyard::testing::ScratchDir;
using ::switchyard::testing::small_tokenizer_path;
using ::switchyard::testing::write_text;

TEST(TokenizerTest, RecipeMinimumVocabularyAgrees) {
  EXPECT_EQ(kMinTokenizerVocabSize, config::kMinCorpusVocabSize);
}

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Spans several blocks and an odd split between updates.
  const std::string long_text(1000, 'a');
  Sha256 h;
  h.update(std::string_view(long_text).substr(0, 77));
  h.update(std::string_view(long_text).substr(77));
  EXPECT_EQ(h.hex_digest(), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(TokenizerTest, SpecialIdsAndVocabulary) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(small_tokenizer_path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->special_ids(), kTrainedSpecialIds);
  EXPECT_EQ(tok->sha256().size(), 64u);
  // Learned pieces compress English: well under one token per byte.
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.";
  EXPECT_LT(tok->encode(text).size(), text.size() / 2);
}

TEST(TokenizerTest, RoundTripsAnyBytes) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(small_tokenizer_path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string samples[] = {
      "Hello, world!\n\nTwo  spaces,\ttabs and\r\nCRLF.",
      " leading and trailing spaces ",
      "Non-ASCII: caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, emoji \xF0\x9F\x9A\x82.",
      "Invalid UTF-8: \xFF\xFE, lone continuation \x80, truncated \xE6\x97, overlong \xC0\xAF.",
      std::string("embedded\0nul", 12),
      "\xE2\x96\x81 is not a space mark here"};
  for (const std::string& text : samples) {
    const std::vector<int32_t> ids = tok->encode(text);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok->vocab_size());
    }
    absl::StatusOr<std::string> back = tok->decode(ids);
    ASSERT_TRUE(back.ok()) << back.status();
    if (text.find("\xE2\x96\x81") == 0) {
      // SentencePiece's own space mark reads back as a space, as in SentencePiece.
      EXPECT_EQ(*back, " " + text.substr(3));
    } else {
      EXPECT_EQ(*back, text);
    }
  }
}

TEST(TokenizerTest, ControlTokensDecodeToNothing) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(small_tokenizer_path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> ids = {1};
  tok->encode_append("to be", &ids);
  ids.push_back(2);
  tok->encode_append(" or not", &ids);
  EXPECT_EQ(*tok->decode(ids), "to be or not");
  EXPECT_TRUE(IsOneLineWith(message_of(tok->decode({0, 5, 512}).status()), "token id 512"));
}

TEST(TokenizerTest, UnigramTrains) {
  ScratchDir dir;
  write_text(dir / "in.txt", testing::corpus_slice(60'000));
  TokenizerTrainOptions options;
  options.inputs = {dir / "in.txt"};
  options.vocab_size = 400;
  options.model_type = "unigram";
  DataProgressSink quiet;
  ASSERT_TRUE(train_tokenizer(options, dir / "u.model", quiet).ok());
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(dir / "u.model");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->special_ids(), kTrainedSpecialIds);
  EXPECT_EQ(*tok->decode(tok->encode("Wherefore art thou \xFF?")), "Wherefore art thou \xFF?");
}

TEST(TokenizerTest, BadFilesAreErrorsNamingTheFile) {
  ScratchDir dir;
  write_text(dir / "text.model", "this is plain text, not a model\n");
  write_text(dir / "empty.model", "");
  for (const std::string name : {"text.model", "empty.model", "missing.model"}) {
    absl::StatusOr<Tokenizer> tok = Tokenizer::load(dir / name);
    ASSERT_FALSE(tok.ok());
    EXPECT_TRUE(IsOneLineWith(message_of(tok.status()), dir / name));
  }
}

TEST(TokenizerTest, DamagedModelsAreRefusedOrLoadWithoutCrashing) {
  const std::string good = read_text(small_tokenizer_path());
  for (size_t step = 0; step < 64; ++step) {
    const size_t at = good.size() * step / 64;
    std::string flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ 0xA5);
    for (const std::string& bytes : {good.substr(0, at), flipped}) {
      absl::StatusOr<Tokenizer> tok = Tokenizer::from_bytes(bytes, "damaged.model");
      if (!tok.ok()) {
        EXPECT_TRUE(IsOneLineWith(message_of(tok.status()), "damaged.model: "));
        continue;
      }
      EXPECT_LE(tok->vocab_size(), kMaxVocabSize);
      std::vector<int32_t> ids = tok->encode("To be, or not to be");
      ids.push_back(static_cast<int32_t>(tok->vocab_size() - 1));
      tok->decode(ids).IgnoreError();
    }
  }
}

TEST(TokenizerTest, SpecialFilesAreRefusedWithoutBlocking) {
  ScratchDir dir;
  ASSERT_EQ(mkfifo((dir / "fifo.model").c_str(), 0600), 0);
  EXPECT_TRUE(IsOneLineWith(message_of(Tokenizer::load(dir / "fifo.model").status()),
                            "fifo.model: is not a regular file"));
}

TEST(TokenizerTest, TrainingRejectsBadInput) {
  ScratchDir dir;
  write_text(dir / "empty.txt", "\n\n");
  DataProgressSink quiet;
  TokenizerTrainOptions options;
  options.vocab_size = 400;
  options.inputs = {dir / "missing.txt"};
  EXPECT_TRUE(IsOneLineWith(message_of(train_tokenizer(options, dir / "t.model", quiet)),
                            dir / "missing.txt"));
  options.inputs = {dir / "empty.txt"};
  EXPECT_TRUE(IsOneLineWith(message_of(train_tokenizer(options, dir / "t.model", quiet)),
                            dir / "empty.txt"));
  write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"txt\": \"no text field\"}\n");
  options.inputs = {dir / "bad.jsonl"};
  EXPECT_TRUE(IsOneLineWith(message_of(train_tokenizer(options, dir / "t.model", quiet)),
                            dir / "bad.jsonl:2:"));
  EXPECT_FALSE(std::filesystem::exists(dir / "t.model"));
}

}  // namespace
}  // namespace switchyard
