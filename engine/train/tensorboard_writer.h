// TensorBoard event files: scalars, histograms and PNG images written as TFRecord-framed
// Event protos that the tensorboard package reads (see shared FORMATS.md, "TensorBoard
// event files"). No TensorFlow dependency: CRC32C and record framing are implemented
// here, PNG encoding in engine/train/png.h.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard {

namespace tensorboard {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF).
// crc32c_extend continues an unmasked CRC over more bytes: crc32c(a + b) ==
// crc32c_extend(crc32c(a), b).
uint32_t crc32c(const void* data, size_t size);
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(absl::string_view s) { return crc32c(s.data(), s.size()); }

// TFRecord's CRC mask: ((c >> 15) | (c << 17)) + 0xA282EAD8, and its inverse.
uint32_t mask_crc(uint32_t crc);
uint32_t unmask_crc(uint32_t masked);

// One TFRecord: u64 length (LE), u32 masked CRC32C of the length bytes, the data,
// u32 masked CRC32C of the data.
std::string frame_record(absl::string_view data);

// Every record's data from a TFRecord file, checking lengths and both CRCs.
absl::StatusOr<std::vector<std::string>> read_records(const std::string& path);

// The bucket limits TensorFlow's histogram summaries use by default: +-1e-12 growing by
// 10% up to 1e20, +-DBL_MAX at the ends and 0 in the middle (sorted ascending).
const std::vector<double>& default_bucket_limits();

}  // namespace tensorboard

// Writes one event file, events.out.tfevents.<10-digit unix time>.<host>.<pid>.switchyard
// (a ".N" suffix is added if that name is taken), in log_dir. Records are buffered;
// flush() (or destruction) writes them out. Thread-safe.
class TensorBoardWriter {
 public:
  // Creates log_dir (and parents) if needed and writes the file_version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> create(const std::string& log_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A scalar (stored as float, as TensorBoard's simple_value is).
  absl::Status add_scalar(const std::string& tag, double value, int64_t step);
  // A histogram with TensorFlow's default bucket limits; runs of empty buckets are
  // collapsed into one. values must be non-empty and finite.
  absl::Status add_histogram(const std::string& tag, const std::vector<double>& values,
                             int64_t step);
  // An RGB image, height*width*3 bytes row-major, stored as PNG (png::encode_rgb).
  absl::Status add_image(const std::string& tag, int height, int width,
                         const std::vector<uint8_t>& rgb, int64_t step);
  absl::Status flush();

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  // Frames and writes one serialized Event. Caller holds mu_.
  absl::Status write_event_locked(const std::string& serialized);

  std::mutex mu_;
  std::string path_;
  std::FILE* file_;
  absl::Status sticky_error_;  // the first write error; later calls return it
};

}  // namespace switchyard
