// Text from untrusted input made safe to print.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace switchyard {

// `text` with every control byte (newline, carriage return, escape, ...) written as \xNN:
// an error that quotes bytes of a file stays one line and cannot drive the terminal.
inline std::string escape_control_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace switchyard
