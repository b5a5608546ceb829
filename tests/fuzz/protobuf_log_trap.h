// For the targets whose readers parse protobuf: libprotobuf writes some complaints (a
// string field that is not UTF-8) straight to stderr, a second line beside the reader's
// own refusal. Any such message is a finding.
#pragma once

#include <cstdio>
#include <string>

#include <google/protobuf/stubs/logging.h>

namespace switchyard::fuzz {

inline void trap_protobuf_log(google::protobuf::LogLevel, const char* file, int line,
                              const std::string& message) {
  std::fprintf(stderr, "libprotobuf wrote to stderr (%s:%d): %s\n", file, line, message.c_str());
  __builtin_trap();
}

// Installed before the first input.
inline const bool kProtobufLogTrapped = (google::protobuf::SetLogHandler(trap_protobuf_log), true);

}  // namespace switchyard::fuzz
