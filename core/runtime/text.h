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

// The length of the well-formed UTF-8 sequence at the start of `s` (1 to 4 bytes), or 0
// when it does not start with one (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF).
inline size_t utf8_sequence_length(std::string_view s) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b = at(0);
  if (b < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) n = 2;
  else if (b >= 0xe0 && b <= 0xef) n = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
  else if (b >= 0xf0 && b <= 0xf4) n = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
  if (n == 0 || s.size() < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (at(i) < 0x80 || at(i) > 0xbf) return 0;
  return n;
}

// `text` with every byte that does not begin a well-formed UTF-8 sequence replaced by
// U+FFFD, so that generated text is always valid UTF-8 (what decoders in other tools do
// with errors="replace").
inline std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t n = utf8_sequence_length(text);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      text.remove_prefix(1);
    } else {
      out.append(text.substr(0, n));
      text.remove_prefix(n);
    }
  }
  return out;
}

}  // namespace switchyard
