// File helpers for untrusted input and for writes that are complete or absent. Every
// error names the file. docs/security.md says what each promises.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace switchyard {

// The most bytes a metadata file (JSON, recipe, manifest, tokenizer model, `latest`)
// may have; larger ones are refused before anything is read. safetensors headers have
// the same cap.
inline constexpr int64_t kMaxMetadataFileBytes = int64_t{100} << 20;

// Whether opening a file follows a symbolic link at its name. kRefuse is for the files the
// engine writes inside a directory it owns (a run directory's metrics.jsonl,
// `checkpoints/latest`): a link planted there is refused, naming it, in the same open that
// reads the file (O_NOFOLLOW), so it cannot be swapped in after a check.
enum class Links { kFollow, kRefuse };

// Size of a regular file. FIFOs, devices, sockets and directories are refused without
// blocking on them.
absl::StatusOr<int64_t> regular_file_size(const std::string& path);
// Reads a regular file of at most `max_bytes`.
absl::StatusOr<std::string> read_file(const std::string& path,
                                      int64_t max_bytes = kMaxMetadataFileBytes,
                                      Links links = Links::kFollow);

// A regular file opened once for reads at any offset (a safetensors file's tensors),
// refused as read_file refuses non-regular files; size() is taken at open.
class RegularFile {
 public:
  static absl::StatusOr<RegularFile> open(const std::string& path, Links links = Links::kFollow);
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  ~RegularFile();

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly `bytes` bytes from `offset`; a short read is an error naming the file.
  absl::Status read_at(int64_t offset, void* data, size_t bytes) const;

 private:
  RegularFile(std::string path, int fd, int64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// `name`, read from a file (`what` says where: "index.json: splits.train[0].file"), as a
// path inside `dir`: a plain file name (no "/", not "." or "..") that, with every symlink
// followed, is a regular file directly inside `dir`. One layout may lead elsewhere: in a
// Hugging Face hub cache snapshot (`dir` is `<repo>/snapshots/<rev>` and `<repo>/blobs` a
// directory, not a symlink), a name may also resolve to a file directly inside
// `<repo>/blobs`.
absl::StatusOr<std::string> path_in_directory(const std::string& dir, const std::string& name,
                                              const std::string& what);

// A file written completely or not at all: bytes go to `path`.partial, and commit()
// checks every write, fsyncs, closes, renames over `path` and fsyncs the directory. A
// writer destroyed without commit() removes the partial file. A symbolic link at the
// partial file's name is refused, never written through, and the rename replaces a link
// at `path` itself: nothing outside the directory is written.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status write(const void* data, size_t bytes);
  absl::Status write(std::string_view bytes) { return write(bytes.data(), bytes.size()); }
  absl::Status commit();

 private:
  AtomicFileWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string partial() const { return path_ + ".partial"; }
  std::string path_;
  int fd_ = -1;
};

absl::Status write_file_atomically(const std::string& path, std::string_view bytes);
// A directory written whole (a checkpoint's step_<N>, a run's final weights): begun as an
// empty `tmp` made by fresh_directory and renamed over `dir` by replace_directory. Neither
// follows a symbolic link found at either name: fresh_directory removes whatever `tmp`
// names (a link itself, not its target) and makes the directory with mkdir, which refuses
// a name taken meanwhile; replace_directory removes `dir` likewise, renames, and fsyncs
// the parent.
absl::Status fresh_directory(const std::string& tmp);
absl::Status replace_directory(const std::string& tmp, const std::string& dir);
// Writes all of `bytes` to `fd`; an error names `path`.
absl::Status write_all(int fd, std::string_view bytes, const std::string& path);
// Opens the file `path` to append to it, creating it, without following a symbolic link
// at its name (refused as read_file's Links::kRefuse refuses it); the caller closes the fd.
absl::StatusOr<int> open_to_append(const std::string& path);
// Copies a regular file to `to`, atomically.
absl::Status copy_file_atomically(const std::string& from, const std::string& to);
// The OS's reason for the last failed call, strerror(errno) ("No space left on device"),
// or "no reason given" when errno is 0. Libraries whose file operations leave errno set
// when they fail (libhdf5's file driver does) need errno cleared before the call.
std::string errno_reason();
// Flushes a written file (or directory) to disk.
absl::Status fsync_path(const std::string& path);
// Sum of the files' sizes; an error names the first that is missing.
absl::StatusOr<int64_t> total_file_bytes(const std::vector<std::string>& paths);

}  // namespace switchyard
