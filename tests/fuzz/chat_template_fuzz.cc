// A chat template file (data/chat_template.h), parsed, then asked to check a
// conversation of the three usual roles.
#include <cstdint>
#include <string>

#include "data/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "template.json";
  const auto chat = sy::ChatTemplate::parse(sy::fuzz::as_text(data, size), name);
  sy::fuzz::require_clean_refusal(chat.status(), name);
  if (!chat.ok()) return 0;
  const sy::Conversation conversation = {
      {"system", "Be brief."}, {"user", "Hello"}, {"assistant", "Hi."}};
  sy::fuzz::require_clean_refusal(chat->check(conversation, name), name);
  return 0;
}
