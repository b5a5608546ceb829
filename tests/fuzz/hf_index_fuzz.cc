// A Hugging Face model.safetensors.index.json's weight map.
#include <cstdint>

#include "checkpoint/hf_import.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "model.safetensors.index.json";
  sy::fuzz::require_clean_refusal(sy::parse_hf_weight_map(sy::fuzz::as_text(data, size), name).status(),
                                  name);
  return 0;
}
