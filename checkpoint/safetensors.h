// safetensors files: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/runtime/file_util.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// One tensor of a validated header: its bytes are [begin, end) of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;
  int64_t end = 0;
};

// Writes tensors (CPU, f32/i32/i64/u8/bf16/f16) in the given order, to `path`,
// completely or not at all (AtomicFileWriter).
absl::Status write_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a file into CPU tensors. The file must be a regular file; its
// header (at most kMaxMetadataFileBytes) is validated whole before any tensor is
// allocated: dtypes, shapes whose byte sizes fit int64, byte ranges inside the data that
// match their shapes and do not overlap, and __metadata__ an object of strings. So the
// tensors never take more memory than the file has bytes. Errors name the file and the
// field ("model.safetensors: field lm_head.weight.dtype must be one of F32, ...").
absl::StatusOr<std::map<std::string, Tensor>> read_safetensors(const std::string& path);

// The same, from the bytes of a whole file; `name` stands for it in errors.
absl::StatusOr<std::map<std::string, Tensor>> parse_safetensors(std::string_view bytes,
                                                                const std::string& name);

// A safetensors file whose tensors are read in parts: the header validated whole at
// open, as read_safetensors validates it, and rows read on demand, so a rank of a
// parallel layout reads only the rows it holds.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> open(const std::string& path);
  const std::string& path() const { return file_.path(); }
  // The tensor's entry, or nullptr when the file has none of that name.
  const SafetensorsEntry* find(const std::string& name) const;
  // Rows [first_row, first_row + out.rows()) of the tensor into `out`, a host tensor of
  // its dtype and row size with those rows inside it (the caller checks; a CHECK holds).
  absl::Status read_rows(const SafetensorsEntry& entry, int64_t first_row, Tensor& out) const;

 private:
  SafetensorsFile(RegularFile file, int64_t data_start,
                  std::map<std::string, SafetensorsEntry> entries)
      : file_(std::move(file)), data_start_(data_start), entries_(std::move(entries)) {}
  RegularFile file_;
  int64_t data_start_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace switchyard
