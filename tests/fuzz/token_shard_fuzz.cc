// An HDF5 token shard, opened from a memory image: open, then every read the loader and
// `inspect` make (document offsets, the largest id, the first and last tokens).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/token_shard.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "fuzz.h5";
  const auto shard = sy::ShardReader::open_image(sy::fuzz::as_text(data, size), name);
  sy::fuzz::require_clean_refusal(shard.status(), name);
  if (!shard.ok()) return 0;
  const sy::ShardReader& reader = **shard;
  sy::fuzz::require_clean_refusal(reader.read_doc_offsets().status(), name);
  sy::fuzz::require_clean_refusal(reader.scan_max_token().status(), name);
  const int64_t count = std::min<int64_t>(reader.num_tokens(), 64);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  sy::fuzz::require_clean_refusal(reader.read_tokens(0, count, tokens.data()), name);
  sy::fuzz::require_clean_refusal(
      reader.read_tokens(reader.num_tokens() - count, count, tokens.data()), name);
  return 0;
}
