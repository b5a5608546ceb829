#include "data/chat_template.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace {

absl::Status bad_template(const std::string& name, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": chat template: ", why));
}

// Field `key` of `object` as a string ("" when absent), refused when too long.
absl::StatusOr<std::string> template_string(const nlohmann::json& object, const char* key,
                                            const std::string& field, const std::string& name) {
  const auto it = object.find(key);
  if (it == object.end()) return std::string();
  if (!it->is_string()) return bad_template(name, absl::StrCat(field, " is not a string"));
  std::string value = it->get<std::string>();
  if (value.size() > kMaxTemplateStringBytes)
    return bad_template(name, absl::StrCat(field, " is longer than ", kMaxTemplateStringBytes,
                                           " bytes"));
  return value;
}

// Every key of `object` is one of `allowed`.
absl::Status only_keys(const nlohmann::json& object, const std::vector<std::string>& allowed,
                       const std::string& field, const std::string& name) {
  for (const auto& [key, value] : object.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      return bad_template(name, absl::StrCat(field, " has an unknown field \"", key,
                                             "\" (known: ", absl::StrJoin(allowed, ", "), ")"));
  return absl::OkStatus();
}

}  // namespace

ChatTemplate::Parts ChatTemplate::split_placeholders(std::string_view text) {
  Parts parts;
  size_t start = 0;
  while (start < text.size()) {
    const size_t bos = text.find("{bos}", start);
    const size_t eos = text.find("{eos}", start);
    const size_t at = std::min(bos, eos);
    if (at == std::string_view::npos) {
      parts.push_back({Part::kText, std::string(text.substr(start))});
      break;
    }
    if (at > start) parts.push_back({Part::kText, std::string(text.substr(start, at - start))});
    parts.push_back({at == bos ? Part::kBos : Part::kEos, ""});
    start = at + 5;
  }
  return parts;
}

absl::StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view json, const std::string& name) {
  SY_ASSIGN_OR_RETURN(const nlohmann::json j,
                      parse_json_object(json, name + ": chat template", kMaxRecordDepth));
  SY_RETURN_IF_ERROR(only_keys(j, {"format", "name", "begin", "end", "roles"}, "the template", name));
  SY_ASSIGN_OR_RETURN(const std::string format, template_string(j, "format", "format", name));
  if (format != kChatTemplateFormat)
    return bad_template(name, absl::StrCat("format must be \"", kChatTemplateFormat, "\""));
  ChatTemplate t;
  SY_ASSIGN_OR_RETURN(t.name_, template_string(j, "name", "name", name));
  if (t.name_.empty()) t.name_ = name;
  SY_ASSIGN_OR_RETURN(const std::string begin, template_string(j, "begin", "begin", name));
  SY_ASSIGN_OR_RETURN(const std::string end, template_string(j, "end", "end", name));
  t.begin_ = split_placeholders(begin);
  t.end_ = split_placeholders(end);
  const auto roles = j.find("roles");
  if (roles == j.end() || !roles->is_object() || roles->empty() ||
      roles->size() > kMaxTemplateRoles)
    return bad_template(name, absl::StrCat("roles must be an object of 1 to ", kMaxTemplateRoles,
                                           " roles"));
  for (const auto& [role, spec] : roles->items()) {
    const std::string field = absl::StrCat("roles.", role.substr(0, kMaxRoleBytes));
    if (role.empty() || role.size() > kMaxRoleBytes)
      return bad_template(name, absl::StrCat("role names must be 1 to ", kMaxRoleBytes, " bytes"));
    if (!spec.is_object()) return bad_template(name, absl::StrCat(field, " is not an object"));
    SY_RETURN_IF_ERROR(only_keys(spec, {"prefix", "suffix", "loss"}, field, name));
    Role r;
    SY_ASSIGN_OR_RETURN(const std::string prefix,
                        template_string(spec, "prefix", field + ".prefix", name));
    SY_ASSIGN_OR_RETURN(const std::string suffix,
                        template_string(spec, "suffix", field + ".suffix", name));
    r.prefix = split_placeholders(prefix);
    r.suffix = split_placeholders(suffix);
    if (const auto loss = spec.find("loss"); loss != spec.end()) {
      if (!loss->is_boolean()) return bad_template(name, absl::StrCat(field, ".loss is not true or false"));
      r.loss = loss->get<bool>();
    }
    t.roles_[role] = std::move(r);
  }
  if (std::none_of(t.roles_.begin(), t.roles_.end(), [](const auto& r) { return r.second.loss; }))
    return bad_template(name, "no role has \"loss\": true, so nothing would be trained");
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::load(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path, kMaxTemplateBytes));
  return parse(text, path);
}

absl::Status ChatTemplate::check_tokenizer(const Tokenizer& tokenizer) const {
  const SpecialTokenIds ids = tokenizer.special_ids();
  std::vector<const Parts*> all = {&begin_, &end_};
  for (const auto& [role, r] : roles_) {
    all.push_back(&r.prefix);
    all.push_back(&r.suffix);
  }
  for (const Parts* parts : all)
    for (const Part& part : *parts)
      if ((part.kind == Part::kBos && ids.bos < 0) || (part.kind == Part::kEos && ids.eos < 0))
        return absl::InvalidArgumentError(absl::StrCat(
            name_, ": chat template uses {", part.kind == Part::kBos ? "bos" : "eos",
            "}, which the tokenizer does not have"));
  return absl::OkStatus();
}

absl::Status ChatTemplate::check(const Conversation& conversation, const std::string& where) const {
  bool trained = false;
  for (const ChatMessage& message : conversation) {
    const auto role = roles_.find(message.role);
    if (role == roles_.end()) {
      std::vector<std::string> names;
      for (const auto& [known, r] : roles_) names.push_back(known);
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": role \"", message.role, "\" is not in chat template ", name_, " (roles: ",
          absl::StrJoin(names, ", "), ")"));
    }
    trained = trained || role->second.loss;
  }
  if (!trained)
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no message of a role that carries loss in chat template ", name_));
  return absl::OkStatus();
}

void ChatTemplate::append(const Parts& parts, uint8_t loss, const Tokenizer& tokenizer,
                          std::vector<int32_t>* ids, std::vector<uint8_t>* mask) {
  const SpecialTokenIds special = tokenizer.special_ids();
  for (const Part& part : parts) {
    if (part.kind == Part::kText) tokenizer.encode_append(part.text, ids);
    else ids->push_back(static_cast<int32_t>(part.kind == Part::kBos ? special.bos : special.eos));
  }
  mask->resize(ids->size(), loss);
}

void ChatTemplate::render(const Conversation& conversation, const Tokenizer& tokenizer,
                          std::vector<int32_t>* ids, std::vector<uint8_t>* mask) const {
  append(begin_, 0, tokenizer, ids, mask);
  for (const ChatMessage& message : conversation) {
    const Role& role = roles_.at(message.role);
    const uint8_t loss = role.loss ? 1 : 0;
    append(role.prefix, 0, tokenizer, ids, mask);
    append({Part{Part::kText, message.content}}, loss, tokenizer, ids, mask);
    append(role.suffix, loss, tokenizer, ids, mask);
  }
  append(end_, 0, tokenizer, ids, mask);
}

}  // namespace switchyard
