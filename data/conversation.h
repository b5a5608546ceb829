// Instruction data: one conversation per JSON Lines record, in either of two shapes:
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}, ...]}
//   {"prompt": "...", "response": "..."}   (optionally "system": "..."), which reads as
//       the messages system (when given), user, assistant.
// Other fields of a record are ignored. A record is untrusted: it must be a JSON object
// nested at most kMaxRecordDepth deep, with 1 to kMaxMessages messages, each with string
// role (1 to kMaxRoleBytes bytes) and content fields.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

inline constexpr int kMaxRecordDepth = 16;
inline constexpr size_t kMaxMessages = 4096;
inline constexpr size_t kMaxRoleBytes = 32;

struct ChatMessage {
  std::string role;
  std::string content;
  bool operator==(const ChatMessage&) const = default;
};

using Conversation = std::vector<ChatMessage>;

// Errors start with `where` (e.g. "chats.jsonl:12").
absl::StatusOr<Conversation> parse_conversation(std::string_view line, const std::string& where);

}  // namespace switchyard
