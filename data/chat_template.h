// Chat templates: how `data prepare --chat-template` lays out a conversation
// (data/conversation.h) as tokens, and which of them carry loss. A template is a JSON
// file (docs/data.md, "Instruction data"; data/templates/ ships Mistral's and Qwen's):
//   {"format": "switchyard-chat-template", "name": "mistral",
//    "begin": "{bos}",                       before the first message, no loss
//    "end": "",                              after the last message, no loss
//    "roles": {"user": {"prefix": "[INST] ", "suffix": " [/INST]"},
//              "assistant": {"prefix": "", "suffix": "{eos}", "loss": true}}}
// Each message becomes prefix, content, suffix, each tokenised on its own; a role with
// "loss": true trains on its content and suffix, never on its prefix. In the strings,
// "{bos}" and "{eos}" stand for the tokenizer's bos and eos ids; any other text,
// special-looking or not, is tokenised as text. A template file is untrusted: a regular
// file of at most kMaxTemplateBytes, nested at most kMaxRecordDepth deep, with 1 to
// kMaxTemplateRoles roles, strings of at most kMaxTemplateStringBytes, and no field
// other than these.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/conversation.h"
#include "data/tokenizer.h"

namespace switchyard {

inline constexpr int64_t kMaxTemplateBytes = 64 * 1024;
inline constexpr size_t kMaxTemplateRoles = 16;
inline constexpr size_t kMaxTemplateStringBytes = 4096;
inline constexpr char kChatTemplateFormat[] = "switchyard-chat-template";

class ChatTemplate {
 public:
  // Errors name `name` (the file) and the field.
  static absl::StatusOr<ChatTemplate> parse(std::string_view json, const std::string& name);
  static absl::StatusOr<ChatTemplate> load(const std::string& path);

  const std::string& name() const { return name_; }
  // The template's placeholders exist in this tokenizer ({bos} needs a bos piece).
  absl::Status check_tokenizer(const Tokenizer& tokenizer) const;
  // Every role of the conversation is the template's, and one carries loss; errors
  // start with `where`.
  absl::Status check(const Conversation& conversation, const std::string& where) const;
  // Appends the conversation's tokens to *ids and their loss mask entries (0 or 1) to
  // *mask. The conversation and tokenizer passed check() and check_tokenizer().
  void render(const Conversation& conversation, const Tokenizer& tokenizer,
              std::vector<int32_t>* ids, std::vector<uint8_t>* mask) const;

 private:
  // A template string split at its placeholders: text, or a special id.
  struct Part {
    enum Kind { kText, kBos, kEos } kind = kText;
    std::string text;
  };
  using Parts = std::vector<Part>;
  struct Role {
    Parts prefix, suffix;
    bool loss = false;
  };
  static Parts split_placeholders(std::string_view text);
  static void append(const Parts& parts, uint8_t loss, const Tokenizer& tokenizer,
                     std::vector<int32_t>* ids, std::vector<uint8_t>* mask);

  std::string name_;
  Parts begin_, end_;
  std::map<std::string, Role> roles_;
};

}  // namespace switchyard
