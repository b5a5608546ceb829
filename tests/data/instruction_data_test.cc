// Instruction data: JSON Lines conversations and chat templates, read as untrusted input;
// the loss mask a template gives; `data prepare --chat-template` storing it beside the
// tokens; shards with and without a /loss_mask reading back; and windows whose masked
// targets are ignored.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/chat_template.h"
#include "data/conversation.h"
#include "data/prepare.h"
#include "data/token_dataset.h"
#include "data/token_shard.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::kRepoRoot;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;
using ::switchyard::testing::small_tokenizer_path;
using ::switchyard::testing::write_text;

ChatTemplate shipped(const std::string& name) {
  auto t = ChatTemplate::load((kRepoRoot / "data/templates" / (name + ".json")).string());
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

TEST(ConversationTest, ReadsMessagesAndPromptResponsePairs) {
  auto messages = parse_conversation(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello.", "extra": 1}], "id": 7})",
      "c.jsonl:1");
  ASSERT_TRUE(messages.ok()) << messages.status();
  EXPECT_EQ(*messages, (Conversation{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}}));
  auto pair = parse_conversation(R"({"prompt": "2+2?", "response": "4"})", "c.jsonl:2");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(*pair, (Conversation{{"user", "2+2?"}, {"assistant", "4"}}));
}

TEST(ConversationTest, HostileRecordsAreOneLineNamingTheLine) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const struct {
    std::string line, want;
  } cases[] = {
      {"not json", "c.jsonl:3: not a JSON object"},
      {"[1, 2]", "c.jsonl:3: not a JSON object"},
      {R"({"text": "x"})", "holds neither \"messages\" nor \"prompt\""},
      {R"({"messages": []})", "must be an array of 1 to 4096 messages"},
      {R"({"messages": {"role": "user"}})", "must be an array"},
      {R"({"messages": ["hi"]})", "message 0: is not an object"},
      {R"({"messages": [{"role": 3, "content": "x"}]})", "message 0: no string field \"role\""},
      {R"({"messages": [{"role": "user"}]})", "no string field \"content\""},
      {R"({"messages": [{"role": "", "content": "x"}]})", "its role must be 1 to 32 bytes"},
      {R"({"prompt": "x"})", "no string field \"response\""},
      {R"({"prompt": "x", "response": null})", "no string field \"response\""},
      {"{\"prompt\": \"\xff\", \"response\": \"x\"}", "not a JSON object"},
      {deep, "nests deeper than 16 levels"},
      {"{\"a\":" + deep + "}", "nests deeper than 16 levels"},
  };
  for (const auto& c : cases)
    EXPECT_TRUE(IsOneLineWith(message_of(parse_conversation(c.line, "c.jsonl:3").status()), c.want))
        << c.line.substr(0, 60);
}

TEST(ChatTemplateTest, MistralMasksEverythingButTheAnswers) {
  const Tokenizer tok = *Tokenizer::load(small_tokenizer_path());
  const ChatTemplate t = shipped("mistral");
  ASSERT_TRUE(t.check_tokenizer(tok).ok());
  const Conversation c = {{"user", "Who art thou?"}, {"assistant", "A friend."},
                          {"user", "Speak."}, {"assistant", "Soft!"}};
  ASSERT_TRUE(t.check(c, "c").ok());
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  t.render(c, tok, &ids, &mask);
  // bos [INST] user [/INST] answer eos [INST] user [/INST] answer eos, each part
  // tokenised on its own; loss on the answers and their eos only.
  std::vector<int32_t> want_ids = {1};
  std::vector<uint8_t> want_mask = {0};
  auto add = [&](const std::string& text, uint8_t loss) {
    const std::vector<int32_t> part = tok.encode(text);
    want_ids.insert(want_ids.end(), part.begin(), part.end());
    want_mask.insert(want_mask.end(), part.size(), loss);
  };
  auto eos = [&] {
    want_ids.push_back(2);
    want_mask.push_back(1);
  };
  add("[INST] ", 0), add("Who art thou?", 0), add(" [/INST]", 0), add("A friend.", 1), eos();
  add("[INST] ", 0), add("Speak.", 0), add(" [/INST]", 0), add("Soft!", 1), eos();
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(mask, want_mask);
  EXPECT_TRUE(IsOneLineWith(message_of(t.check({{"system", "x"}, {"assistant", "y"}}, "c.jsonl:4")),
                            "c.jsonl:4: role \"system\" is not in chat template mistral "
                            "(roles: assistant, user)"));
  EXPECT_TRUE(IsOneLineWith(message_of(t.check({{"user", "x"}}, "c.jsonl:5")),
                            "c.jsonl:5: no message of a role that carries loss"));
}

TEST(ChatTemplateTest, QwenTrainsTheAnswerAndItsEndMarkerNotThePrompt) {
  const Tokenizer tok = *Tokenizer::load(small_tokenizer_path());
  const ChatTemplate t = shipped("qwen");
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  t.render({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, tok, &ids, &mask);
  ASSERT_EQ(ids.size(), mask.size());
  const std::vector<int32_t> answer = tok.encode("A");
  const std::vector<int32_t> end = tok.encode("<|im_end|>\n");
  const int64_t trained = std::count(mask.begin(), mask.end(), 1);
  EXPECT_EQ(trained, static_cast<int64_t>(answer.size() + end.size()));
  // The trained tokens are the last ones: the answer, then its end marker.
  EXPECT_TRUE(std::all_of(mask.end() - trained, mask.end(), [](uint8_t m) { return m == 1; }));
  std::vector<int32_t> tail(ids.end() - trained, ids.end());
  std::vector<int32_t> want = answer;
  want.insert(want.end(), end.begin(), end.end());
  EXPECT_EQ(tail, want);
}

TEST(ChatTemplateTest, HostileTemplatesAreOneLineNamingTheFile) {
  const std::string ok_roles = R"("roles": {"assistant": {"loss": true}})";
  const std::string deep = std::string(1000, '[') + std::string(1000, ']');
  const struct {
    std::string json, want;
  } cases[] = {
      {"", "t.json: chat template: not a JSON object"},
      {R"({"roles": {"assistant": {"loss": true}}})", "format must be \"switchyard-chat-template\""},
      {R"({"format": "switchyard-chat-template"})", "roles must be an object of 1 to 16 roles"},
      {R"({"format": "switchyard-chat-template", "roles": {}})", "roles must be an object"},
      {R"({"format": "switchyard-chat-template", "roles": {"user": {}}})",
       "no role has \"loss\": true"},
      {R"({"format": "switchyard-chat-template", "roles": {"user": {"los": true}}})",
       "roles.user has an unknown field \"los\""},
      {R"({"format": "switchyard-chat-template", "system": "x", )" + ok_roles + "}",
       "the template has an unknown field \"system\""},
      {R"({"format": "switchyard-chat-template", "roles": {"a": {"loss": "yes"}}})",
       "roles.a.loss is not true or false"},
      {R"({"format": "switchyard-chat-template", "roles": {"a": {"prefix": 1, "loss": true}}})",
       "roles.a.prefix is not a string"},
      {R"({"format": "switchyard-chat-template", "begin": ")" + std::string(5000, 'x') + "\", " +
           ok_roles + "}",
       "begin is longer than 4096 bytes"},
      {R"({"format": "switchyard-chat-template", "roles": {")" + std::string(40, 'r') +
           R"(": {"loss": true}}})",
       "role names must be 1 to 32 bytes"},
      {R"({"format": "switchyard-chat-template", "roles": )" + deep + "}",
       "nests deeper than 16 levels"},
  };
  for (const auto& c : cases)
    EXPECT_TRUE(IsOneLineWith(message_of(ChatTemplate::parse(c.json, "t.json").status()), c.want))
        << c.json.substr(0, 80);
  ScratchDir dir;
  EXPECT_TRUE(IsOneLineWith(message_of(ChatTemplate::load(dir.path().string()).status()),
                            dir.path().string()));
}

ShardAttributes attributes() {
  ShardAttributes a;
  a.tokenizer_sha256 = "abc";
  a.vocab_size = 1000;
  a.special_ids = kTrainedSpecialIds;
  return a;
}

TEST(LossMaskShardTest, RoundTripsAndDefaultsToOnesBeforeTheFirstMask) {
  ScratchDir dir;
  const std::string path = dir / "s.h5";
  auto writer = *ShardWriter::create(path, attributes());
  const std::vector<int32_t> plain = {5, 6, 2}, chat = {7, 8, 9, 2};
  const std::vector<uint8_t> chat_mask = {0, 0, 1, 1};
  ASSERT_TRUE(writer->append_document(plain.data(), 3).ok());
  EXPECT_FALSE(writer->has_loss_mask());
  ASSERT_TRUE(writer->append_document(chat.data(), 4, chat_mask.data()).ok());
  ASSERT_TRUE(writer->append_document(plain.data(), 3).ok());
  ASSERT_TRUE(writer->close().ok());
  auto reader = ShardReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->has_loss_mask());
  std::vector<uint8_t> mask(10);
  ASSERT_TRUE((*reader)->read_loss_mask(0, 10, mask.data()).ok());
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(*(*reader)->count_loss_tokens(), 8);
  const std::vector<uint8_t> bad = {0, 2, 1, 1};
  auto refused = *ShardWriter::create(dir / "bad.h5", attributes());
  EXPECT_TRUE(IsOneLineWith(message_of(refused->append_document(chat.data(), 4, bad.data())),
                            "loss mask entry 2 of document 0 is not 0 or 1"));
}

TEST(LossMaskShardTest, ShardsWithoutAMaskReadAsAllOnes) {
  ScratchDir dir;
  const std::string path = dir / "s.h5";
  auto writer = *ShardWriter::create(path, attributes());
  const std::vector<int32_t> doc = {5, 6, 2};
  ASSERT_TRUE(writer->append_document(doc.data(), 3).ok());
  ASSERT_TRUE(writer->close().ok());
  auto reader = *ShardReader::open(path);
  EXPECT_FALSE(reader->has_loss_mask());
  std::vector<uint8_t> mask(3, 7);
  ASSERT_TRUE(reader->read_loss_mask(0, 3, mask.data()).ok());
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(LossMaskShardTest, DamagedMasksAreRefusedNamingTheShard) {
  ScratchDir dir;
  const std::string path = dir / "s.h5";
  {
    auto writer = *ShardWriter::create(path, attributes());
    const std::vector<int32_t> doc = {5, 6, 7, 8, 9, 10, 11, 2};
    const std::vector<uint8_t> mask = {0, 0, 0, 0, 1, 1, 1, 1};
    ASSERT_TRUE(writer->append_document(doc.data(), 8, mask.data()).ok());
    ASSERT_TRUE(writer->close().ok());
  }
  // The mask's bytes, as the writer laid them out, with one entry made 3.
  const int64_t at = testing::find_in_file(path, std::string("\0\0\0\0\1\1\1\1", 8));
  ASSERT_GE(at, 0);
  testing::patch_file(path, at + 5, "\3");
  auto reader = *ShardReader::open(path);
  std::vector<uint8_t> mask(8);
  EXPECT_TRUE(IsOneLineWith(message_of(reader->read_loss_mask(0, 8, mask.data())),
                            path + ": /loss_mask entry 5 is 3, not 0 or 1"));
  EXPECT_TRUE(IsOneLineWith(message_of(reader->count_loss_tokens().status()), path));
}

class InstructionPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    input_ = dir_ / "chats.jsonl";
    options_.tokenizer_path = small_tokenizer_path();
    options_.inputs = {input_};
    options_.out_dir = dir_ / "out";
    options_.val_fraction = 0;
    options_.chat_template = (kRepoRoot / "data/templates/mistral.json").string();
  }
  ScratchDir dir_;
  std::string input_;
  PrepareOptions options_;
  DataProgressSink quiet_;
};

TEST_F(InstructionPrepareTest, ShardsKeepTheTemplatesMaskAndWindowsIgnoreMaskedTargets) {
  write_text(input_,
             "{\"prompt\": \"Who is there?\", \"response\": \"Nay, answer me.\"}\n\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Speak.\"}, "
             "{\"role\": \"assistant\", \"content\": \"Long live the king!\"}]}\n");
  auto summary = prepare_dataset(options_, quiet_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  auto data = TokenDataset::open(options_.out_dir, "train");
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(data->has_loss_mask());
  EXPECT_EQ(data->num_documents(), 2);
  // Each conversation is the template's rendering, ending in its own eos.
  const Tokenizer tok = *Tokenizer::load(small_tokenizer_path());
  const ChatTemplate t = shipped("mistral");
  std::vector<int32_t> want_ids;
  std::vector<uint8_t> want_mask;
  t.render({{"user", "Who is there?"}, {"assistant", "Nay, answer me."}}, tok, &want_ids, &want_mask);
  t.render({{"user", "Speak."}, {"assistant", "Long live the king!"}}, tok, &want_ids, &want_mask);
  const int64_t n = data->num_tokens();
  ASSERT_EQ(n, static_cast<int64_t>(want_ids.size()));
  std::vector<int32_t> ids(n);
  std::vector<uint8_t> mask(n);
  ASSERT_TRUE(data->read_tokens(0, n, ids.data()).ok());
  ASSERT_TRUE(data->read_loss_mask(0, n, mask.data()).ok());
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(mask, want_mask);
  // A window's target i is token i + 1, ignored where its mask entry is 0.
  const int64_t seq = 8;
  for (int64_t w = 0; w < data->num_windows(seq); ++w) {
    std::vector<int32_t> window_ids(seq), targets(seq);
    ASSERT_TRUE(data->read_window(w, seq, window_ids.data(), targets.data()).ok());
    for (int64_t i = 0; i < seq; ++i) {
      const int64_t token = w * seq + i + 1;
      EXPECT_EQ(targets[i], mask[token] ? ids[token] : kIgnoredTarget) << "window " << w;
      EXPECT_EQ(window_ids[i], ids[token - 1]);
    }
  }
}

TEST_F(InstructionPrepareTest, HostileInputIsOneLineNamingTheLineAndLeavesNothing) {
  const struct {
    std::string text, want;
  } cases[] = {
      {"{\"prompt\": \"a\", \"response\": \"b\"}\n[]\n", "chats.jsonl:2: not a JSON object"},
      {"{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}, "
       "{\"role\": \"assistant\", \"content\": \"y\"}]}\n",
       "chats.jsonl:1: role \"system\" is not in chat template mistral"},
      {"\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
       "chats.jsonl:3: no message of a role that carries loss"},
  };
  for (const auto& c : cases) {
    write_text(input_, c.text);
    EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()), c.want));
    EXPECT_FALSE(std::filesystem::exists(options_.out_dir));
  }
  write_text(dir_ / "plain.txt", "Not JSON Lines.\n");
  options_.inputs = {dir_ / "plain.txt"};
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()),
                            "--chat-template reads JSON Lines conversations"));
  options_.inputs = {input_};
  write_text(dir_ / "t.json", "{\"format\": \"switchyard-chat-template\"}");
  options_.chat_template = dir_ / "t.json";
  EXPECT_TRUE(IsOneLineWith(message_of(prepare_dataset(options_, quiet_).status()),
                            "t.json: chat template: roles must be"));
}

}  // namespace
}  // namespace switchyard
