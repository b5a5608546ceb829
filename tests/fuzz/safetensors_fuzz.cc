// A safetensors file, parsed from memory: every tensor read, or one clean refusal.
#include <cstdint>

#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "model.safetensors";
  sy::fuzz::require_clean_refusal(sy::parse_safetensors(sy::fuzz::as_text(data, size), name).status(),
                                  name);
  return 0;
}
