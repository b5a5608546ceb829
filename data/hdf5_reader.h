// The engine's own reader of the HDF5 files it writes (token shards, checkpoint rank
// files), so that no byte of a file it reads reaches libhdf5's parser; libhdf5 only
// writes. It reads exactly the subset those writers produce (data/hdf5_writer.h):
//   - superblock version 2 or 3 at offset 0, 8-byte offsets and lengths, no extension;
//   - version 2 object headers ("OHDR", continuation chunks "OCHK"), every chunk's
//     checksum verified;
//   - groups with compact link storage, hard links only; compact attribute storage;
//   - datasets with contiguous storage inside the file, no filters, no external files;
//   - little-endian integers, IEEE floats and fixed-length strings.
// Anything else is refused with one line naming the file and the object. Every address
// and length is checked against the file's size before it is read, header chunks are
// bounded in size and number, and a chunk is visited once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace switchyard {

struct Hdf5Type {
  enum Class { kInteger, kFloat, kString };
  Class type_class = kInteger;
  int64_t size = 0;  // bytes per element
  bool is_signed = false;
};

struct Hdf5Dataset {
  std::string where;  // "<file>: /name", for errors
  Hdf5Type type;
  std::vector<int64_t> dims;  // empty for a scalar
  int64_t num_bytes = 0;      // elements x type size; checked against the file
  int64_t offset = 0;         // of the contiguous data in the file (unused when empty)
};

class Hdf5File {
 public:
  // Reads and checks the superblock. `path` must be a regular file.
  static absl::StatusOr<Hdf5File> open(const std::string& path);
  // The same over an in-memory image (copied); `name` names it in errors.
  static absl::StatusOr<Hdf5File> open_image(std::string_view bytes, const std::string& name);
  Hdf5File(Hdf5File&&) noexcept;
  Hdf5File& operator=(Hdf5File&&) noexcept;
  ~Hdf5File();

  const std::string& name() const { return name_; }
  int64_t size() const { return size_; }

  // The dataset at `path` ("tokens", "param/model.norm.weight"), every component a hard
  // link in compact storage.
  absl::StatusOr<Hdf5Dataset> dataset(std::string_view path) const;
  // The value of the root group's attribute `name` (its raw bytes: one element, its
  // type in `type`), or nullopt when the root has no such attribute.
  struct Attribute {
    Hdf5Type type;
    std::string bytes;
  };
  absl::StatusOr<std::optional<Attribute>> root_attribute(std::string_view name) const;
  // Bytes [begin, begin + count) of the dataset's data into `out`.
  absl::Status read(const Hdf5Dataset& dataset, int64_t begin, int64_t count, void* out) const;

  // Reads `count` bytes at `offset` of the file; an error when they are not all there.
  absl::Status read_bytes(int64_t offset, int64_t count, void* out) const;

 private:
  struct Source;
  Hdf5File(std::string name, std::unique_ptr<Source> source, int64_t size);
  absl::Status read_superblock();

  std::string name_;
  std::unique_ptr<Source> source_;
  int64_t size_ = 0;
  uint64_t root_address_ = 0;
};

// HDF5's metadata checksum (Bob Jenkins' lookup3 hashlittle, initial value 0).
uint32_t hdf5_checksum(std::string_view bytes);

}  // namespace switchyard
