// An HDF5 token shard, opened from a memory image: open, then every read the loader and
// `inspect` make (document offsets, the largest id, the first and last tokens, the loss
// mask). Each
// input is read as it is and resealed (hdf5_reseal.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_shard.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/hdf5_reseal.h"

namespace sy = switchyard;

namespace {

void read_everything(std::string_view image) {
  const std::string name = "fuzz.h5";
  const auto shard = sy::ShardReader::open_image(image, name);
  sy::fuzz::require_clean_refusal(shard.status(), name);
  if (!shard.ok()) return;
  const sy::ShardReader& reader = **shard;
  sy::fuzz::require_clean_refusal(reader.read_doc_offsets().status(), name);
  sy::fuzz::require_clean_refusal(reader.scan_max_token().status(), name);
  const int64_t count = std::min<int64_t>(reader.num_tokens(), 64);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  sy::fuzz::require_clean_refusal(reader.read_tokens(0, count, tokens.data()), name);
  sy::fuzz::require_clean_refusal(
      reader.read_tokens(reader.num_tokens() - count, count, tokens.data()), name);
  sy::fuzz::require_clean_refusal(reader.count_loss_tokens().status(), name);
  std::vector<uint8_t> mask(static_cast<size_t>(count));
  sy::fuzz::require_clean_refusal(
      reader.read_loss_mask(reader.num_tokens() - count, count, mask.data()), name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sy::fuzz::read_as_given_and_resealed(sy::fuzz::as_text(data, size), read_everything);
  return 0;
}
