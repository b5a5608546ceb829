// A checkpoint's manifest.pb, parsed and validated from memory (format, recipe, every
// slice's names, shape, rows and checksum, the slices tiling each tensor).
#include <cstdint>

#include "checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/protobuf_log_trap.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "step_1/manifest.pb";
  sy::fuzz::require_clean_refusal(sy::parse_manifest(sy::fuzz::as_text(data, size), name).status(),
                                  name);
  return 0;
}
