// What every fuzz target asserts of a reader, and a scratch directory for the readers
// that take a path. A reader may refuse an input, but only as the engine promises
// (docs/security.md): a status whose message is one non-empty line naming the input.
// Anything else (a crash, a sanitizer report, an allocation past -malloc_limit_mb, a
// slow input past -timeout) is a finding.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "core/runtime/text.h"

namespace switchyard::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Traps (a crash libFuzzer records) unless `status` is ok or a refusal that contains
// `name` and is one line as `switchyard` prints it (control bytes escaped).
inline void require_clean_refusal(const absl::Status& status, std::string_view name) {
  if (status.ok()) return;
  const std::string message = escape_control_bytes(std::string(status.message()));
  const bool clean = !message.empty() && message.find('\n') == std::string::npos &&
                     message.find(name) != std::string::npos;
  if (clean) return;
  std::fprintf(stderr, "not a one-line refusal naming %.*s: %.*s\n",
               static_cast<int>(name.size()), name.data(), static_cast<int>(message.size()),
               message.data());
  __builtin_trap();
}

// A directory of this process's own under $TMPDIR (default /dev/shm, so the fuzz loop
// does not touch the disk), made on first use.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/dev/shm") + "/sy-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) __builtin_trap();
    return pattern;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/`name` and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) __builtin_trap();
  return path;
}

}  // namespace switchyard::fuzz
