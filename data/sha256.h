// SHA-256, for the tokenizer fingerprint and the shard checksums the dataset index
// records (the same digests `sha256sum` and Python's hashlib print).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace switchyard {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // Lower-case hex digest; the object is spent afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);
absl::StatusOr<std::string> sha256_file(const std::string& path);

}  // namespace switchyard
