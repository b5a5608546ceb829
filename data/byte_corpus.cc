#include "data/byte_corpus.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/rng.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {

absl::StatusOr<std::string> ByteCorpus::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the corpus file"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": the corpus is empty"));
  return buffer.str();
}

absl::StatusOr<ByteCorpus> ByteCorpus::load_for_eval(const std::string& path, int64_t seq_len) {
  ByteCorpus c;
  SY_ASSIGN_OR_RETURN(c.bytes_, read(path));
  c.seq_len_ = seq_len;
  if (c.val_tokens() < seq_len + 1)
    return absl::InvalidArgumentError(absl::StrCat(path, ": has ", c.val_tokens(),
                                                   " bytes, fewer than one window of ", seq_len + 1));
  return c;
}

absl::StatusOr<ByteCorpus> ByteCorpus::load(const std::string& path, double val_fraction,
                                            int64_t seq_len) {
  ByteCorpus c;
  SY_ASSIGN_OR_RETURN(c.bytes_, read(path));
  c.seq_len_ = seq_len;
  const int64_t size = static_cast<int64_t>(c.bytes_.size());
  c.train_end_ = size - static_cast<int64_t>(static_cast<double>(size) * val_fraction);
  if (c.train_end_ < seq_len + 1)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the training part has ", c.train_end_, " bytes, fewer than train.seq_len + 1 (",
        seq_len + 1, ")"));
  if (val_fraction > 0 && c.val_tokens() < seq_len + 1)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the validation part has ", c.val_tokens(), " bytes, fewer than train.seq_len + 1 (",
        seq_len + 1, "); lower train.seq_len or raise data.val_fraction"));
  return c;
}

void ByteCorpus::window(int64_t start, int32_t* ids, int32_t* targets) const {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
  for (int64_t i = 0; i < seq_len_; ++i) {
    ids[i] = b[i];
    targets[i] = b[i + 1];
  }
}

void ByteCorpus::train_batch(uint64_t seed, int64_t step, int64_t first, int64_t batch,
                             int32_t* ids, int32_t* targets) const {
  const int64_t starts = train_end_ - seq_len_;  // valid window starts: [0, starts)
  for (int64_t s = 0; s < batch; ++s) {
    // One stream per (step, sequence): independent of how sequences are split.
    Rng rng = Rng(seed).fork(static_cast<uint64_t>(step) * 1000003ULL + (first + s));
    window(static_cast<int64_t>(rng.below(starts)), ids + s * seq_len_, targets + s * seq_len_);
  }
}

void ByteCorpus::val_batch(int64_t index, int64_t batch, int32_t* ids, int32_t* targets) const {
  const int64_t windows = val_windows();
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t w = (index * batch + s) % windows;
    window(train_end_ + w * seq_len_, ids + s * seq_len_, targets + s * seq_len_);
  }
}

std::vector<int32_t> ByteCorpus::encode(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteCorpus::decode(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s.push_back(static_cast<char>(id));
  return s;
}

}  // namespace switchyard
