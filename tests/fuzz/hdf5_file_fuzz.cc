// The engine's HDF5 reader (data/hdf5_reader.h) on a memory image: the superblock, then
// the datasets and root attributes a token shard or a checkpoint rank file holds (and a
// few that no file holds), and the first and last bytes of each dataset found. A read
// takes at most kMaxReadBytes, whatever size the file declares. Each input is read as it
// is and resealed (hdf5_reseal.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/hdf5_reader.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/hdf5_reseal.h"

namespace sy = switchyard;

namespace {

constexpr int64_t kMaxReadBytes = int64_t{1} << 20;

// Token shards: tokens, doc_offsets. Rank files: <state>/<tensor>, one group level.
constexpr const char* kDatasets[] = {
    "tokens",
    "doc_offsets",
    "param/model.norm.weight",
    "exp_avg/model.norm.weight",
    "exp_avg_sq/model.norm.weight",
    "param/model.embed_tokens.weight",
    "param",
    "param/missing/deeper",
};

constexpr const char* kAttributes[] = {
    "format_version", "tokenizer_sha256", "vocab_size", "unk_id", "bos_id", "eos_id", "pad_id",
};

void read_ends(const sy::Hdf5File& file, const sy::Hdf5Dataset& dataset,
               std::vector<char>& buffer) {
  const int64_t count = std::min(dataset.num_bytes, kMaxReadBytes);
  buffer.resize(static_cast<size_t>(count));
  sy::fuzz::require_clean_refusal(file.read(dataset, 0, count, buffer.data()), file.name());
  sy::fuzz::require_clean_refusal(
      file.read(dataset, dataset.num_bytes - count, count, buffer.data()), file.name());
}

void read_everything(std::string_view image) {
  const std::string name = "rank_0.h5";
  const auto file = sy::Hdf5File::open_image(image, name);
  sy::fuzz::require_clean_refusal(file.status(), name);
  if (!file.ok()) return;
  std::vector<char> buffer;
  for (const char* path : kDatasets) {
    const auto dataset = file->dataset(path);
    sy::fuzz::require_clean_refusal(dataset.status(), name);
    if (dataset.ok()) read_ends(*file, *dataset, buffer);
  }
  for (const char* attribute : kAttributes)
    sy::fuzz::require_clean_refusal(file->root_attribute(attribute).status(), name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sy::fuzz::read_as_given_and_resealed(sy::fuzz::as_text(data, size), read_everything);
  return 0;
}
