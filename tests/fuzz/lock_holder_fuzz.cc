// A directory lock's file (DIR/.switchyard.lock), read for its holder's identity while
// another writer holds it, so possibly half-written or not the engine's: any bytes
// describe a holder, or "holder unknown", on one line of bounded length with no control
// byte, the refusal's text (core/runtime/dir_lock.h).
#include <cstdint>
#include <string>

#include "core/runtime/dir_lock.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string holder = sy::describe_lock_holder(sy::fuzz::as_text(data, size));
  // Each field is at most what the file holds, and escaping a byte takes 4.
  if (holder.empty() || holder.size() > 4 * static_cast<size_t>(sy::kMaxLockFileBytes) + 256)
    __builtin_trap();
  for (const char c : holder) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) __builtin_trap();
  }
  return 0;
}
