// A dataset directory's index.json (the shards it names need not exist: the index is
// read, not the data).
#include <cstdint>

#include "data/dataset_index.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sy::fuzz::write_scratch(sy::kIndexFileName, sy::fuzz::as_text(data, size));
  const std::string& dir = sy::fuzz::scratch_dir();
  sy::fuzz::require_clean_refusal(sy::read_dataset_index(dir).status(), dir);
  return 0;
}
