// A plain-text corpus read as bytes: token id = byte value (vocabulary 256). The tail
// `val_fraction` of the file is held out for validation. Training windows of seq_len+1
// tokens start at offsets drawn from a seeded stream per step, so the batches of a run
// are a pure function of (seed, step) and any layout can reproduce them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard {

inline constexpr int64_t kByteVocabSize = 256;

class ByteCorpus {
 public:
  static absl::StatusOr<ByteCorpus> load(const std::string& path, double val_fraction,
                                         int64_t seq_len);
  // The whole file as validation data (for `switchyard eval`).
  static absl::StatusOr<ByteCorpus> load_for_eval(const std::string& path, int64_t seq_len);

  // Fills ids/targets (batch * seq_len each, row-major) with the training windows of
  // sequences [first, first + batch) of global step `step`.
  void train_batch(uint64_t seed, int64_t step, int64_t first, int64_t batch, int32_t* ids,
                   int32_t* targets) const;
  // Validation windows in order, non-overlapping; index wraps around.
  void val_batch(int64_t index, int64_t batch, int32_t* ids, int32_t* targets) const;

  int64_t train_tokens() const { return train_end_; }
  int64_t val_tokens() const { return static_cast<int64_t>(bytes_.size()) - train_end_; }
  int64_t val_windows() const { return (val_tokens() - 1) / seq_len_; }

  // Byte tokens to text and back.
  static std::vector<int32_t> encode(const std::string& text);
  static std::string decode(const std::vector<int32_t>& ids);

 private:
  static absl::StatusOr<std::string> read(const std::string& path);
  void window(int64_t start, int32_t* ids, int32_t* targets) const;
  std::string bytes_;
  int64_t train_end_ = 0;
  int64_t seq_len_ = 0;
};

}  // namespace switchyard
