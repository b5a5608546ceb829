// Instruction data: one JSON Lines record read as a conversation (data/conversation.h),
// then checked against and rendered through the shipped Mistral chat template with a
// byte-level stand-in for a tokenizer's work (the template's own parsing has its target,
// chat_template).
#include <cstdint>
#include <string>

#include "data/chat_template.h"
#include "data/conversation.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string where = "chats.jsonl:1";
  const auto conversation = sy::parse_conversation(sy::fuzz::as_text(data, size), where);
  sy::fuzz::require_clean_refusal(conversation.status(), where);
  if (!conversation.ok()) return 0;
  static const auto chat = sy::ChatTemplate::parse(
      R"({"format": "switchyard-chat-template", "name": "mistral", "begin": "{bos}",
          "roles": {"user": {"prefix": "[INST] ", "suffix": " [/INST]"},
                    "assistant": {"prefix": "", "suffix": "{eos}", "loss": true}}})",
      "mistral.json");
  if (!chat.ok()) __builtin_trap();
  sy::fuzz::require_clean_refusal(chat->check(*conversation, where), where);
  return 0;
}
