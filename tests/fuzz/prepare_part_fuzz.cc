// A part record of `data prepare` (part-00000-of-00001.json): what a resumed prepare and
// merge-parts read back.
#include <cstdint>

#include "data/prepare_parts.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      sy::fuzz::write_scratch(sy::part_record_name(sy::PartId{}), sy::fuzz::as_text(data, size));
  sy::fuzz::require_clean_refusal(sy::read_part_record(path).status(), path);
  return 0;
}
