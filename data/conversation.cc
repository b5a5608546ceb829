#include "data/conversation.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace {

absl::Status bad_record(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
}

// A string field of `object`, or an error naming it.
absl::StatusOr<std::string> string_field(const nlohmann::json& object, const char* name,
                                         const std::string& where) {
  const auto field = object.find(name);
  if (field == object.end() || !field->is_string())
    return bad_record(where, absl::StrCat("no string field \"", name, "\""));
  return field->get<std::string>();
}

absl::StatusOr<Conversation> from_messages(const nlohmann::json& messages,
                                           const std::string& where) {
  if (!messages.is_array() || messages.empty() || messages.size() > kMaxMessages)
    return bad_record(where, absl::StrCat("\"messages\" must be an array of 1 to ", kMaxMessages,
                                          " messages"));
  Conversation conversation;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = absl::StrCat(where, ": message ", i);
    if (!messages[i].is_object()) return bad_record(at, "is not an object");
    ChatMessage message;
    absl::StatusOr<std::string> role = string_field(messages[i], "role", at);
    if (!role.ok()) return role.status();
    if (role->empty() || role->size() > kMaxRoleBytes)
      return bad_record(at, absl::StrCat("its role must be 1 to ", kMaxRoleBytes, " bytes"));
    absl::StatusOr<std::string> content = string_field(messages[i], "content", at);
    if (!content.ok()) return content.status();
    conversation.push_back({std::move(*role), std::move(*content)});
  }
  return conversation;
}

absl::StatusOr<Conversation> from_pair(const nlohmann::json& record, const std::string& where) {
  Conversation conversation;
  if (record.contains("system")) {
    absl::StatusOr<std::string> system = string_field(record, "system", where);
    if (!system.ok()) return system.status();
    conversation.push_back({"system", std::move(*system)});
  }
  absl::StatusOr<std::string> prompt = string_field(record, "prompt", where);
  if (!prompt.ok()) return prompt.status();
  absl::StatusOr<std::string> response = string_field(record, "response", where);
  if (!response.ok()) return response.status();
  conversation.push_back({"user", std::move(*prompt)});
  conversation.push_back({"assistant", std::move(*response)});
  return conversation;
}

}  // namespace

absl::StatusOr<Conversation> parse_conversation(std::string_view line, const std::string& where) {
  SY_ASSIGN_OR_RETURN(const nlohmann::json record,
                      parse_json_object(line, where, kMaxRecordDepth));
  if (const auto messages = record.find("messages"); messages != record.end())
    return from_messages(*messages, where);
  if (record.contains("prompt") || record.contains("response")) return from_pair(record, where);
  return bad_record(where, "holds neither \"messages\" nor \"prompt\" and \"response\"");
}

}  // namespace switchyard
