#include "core/runtime/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/runtime/status_macros.h"
#include "core/runtime/text.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// An fd closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The refusal of a symbolic link that an open with O_NOFOLLOW met.
absl::Status link_refused(const std::string& path) {
  std::error_code ec;
  const fs::path target = fs::read_symlink(path, ec);
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": is a symbolic link", ec ? "" : absl::StrCat(" (to ", target.string(), ")"),
                   "; the engine never follows a link at the name of a file it writes: "
                   "remove the link"));
}

// Opens `path` for reading without blocking (a FIFO would otherwise wait for a writer)
// and checks that it is a regular file; returns its size through `size`.
absl::StatusOr<int> open_regular(const std::string& path, int64_t* size,
                                 Links links = Links::kFollow) {
  const int no_follow = links == Links::kRefuse ? O_NOFOLLOW : 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | no_follow);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    if (errno == ELOOP && no_follow) return link_refused(path);
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", errno_reason()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", errno_reason()));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is not a regular file"));
  }
  *size = static_cast<int64_t>(st.st_size);
  return fd;
}

// The directories a name inside `real_dir` (a canonical path) may resolve into: `real_dir`
// itself, and when it is a snapshot of a Hugging Face hub cache, `<repo>/snapshots/<rev>`
// whose `<repo>/blobs` is a directory and not a symlink, `<repo>/blobs` (the hub keeps every
// file of a snapshot there and links it as ../../blobs/<hash>).
std::vector<fs::path> resolution_directories(const fs::path& real_dir) {
  std::vector<fs::path> dirs{real_dir};
  const fs::path snapshots = real_dir.parent_path();
  if (snapshots.filename() != "snapshots") return dirs;
  const fs::path blobs = snapshots.parent_path() / "blobs";
  std::error_code ec;
  if (fs::symlink_status(blobs, ec).type() == fs::file_type::directory) dirs.push_back(blobs);
  return dirs;
}

}  // namespace

absl::Status write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::DataLossError(absl::StrCat(path, ": write failed: ", errno_reason()));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status fresh_directory(const std::string& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  const fs::path parent = fs::path(tmp).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec || ::mkdir(tmp.c_str(), 0777) != 0)
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot create: ", ec ? ec.message() : errno_reason()));
  return absl::OkStatus();
}

absl::Status replace_directory(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) return absl::DataLossError(absl::StrCat(dir, ": cannot rename into place: ", ec.message()));
  const fs::path parent = fs::path(dir).parent_path();
  return fsync_path(parent.empty() ? "." : parent.string());
}

absl::StatusOr<int> open_to_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP) return link_refused(path);
  if (fd < 0)
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", errno_reason()));
  return fd;
}

absl::StatusOr<int64_t> regular_file_size(const std::string& path) {
  int64_t size = 0;
  SY_ASSIGN_OR_RETURN(const int fd, open_regular(path, &size));
  ::close(fd);
  return size;
}

absl::StatusOr<std::string> read_file(const std::string& path, int64_t max_bytes, Links links) {
  SY_ASSIGN_OR_RETURN(const RegularFile file, RegularFile::open(path, links));
  if (file.size() > max_bytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", file.size(),
                                                   " bytes, more than the ", max_bytes,
                                                   " allowed"));
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  SY_RETURN_IF_ERROR(file.read_at(0, bytes.data(), bytes.size()));
  return bytes;
}

absl::StatusOr<RegularFile> RegularFile::open(const std::string& path, Links links) {
  int64_t size = 0;
  SY_ASSIGN_OR_RETURN(const int fd, open_regular(path, &size, links));
  return RegularFile(path, fd, size);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RegularFile::read_at(int64_t offset, void* data, size_t bytes) const {
  char* out = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(path_, ": read error: ", errno_reason()));
    if (n == 0) return absl::DataLossError(absl::StrCat(path_, ": shrank while being read"));
    out += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> path_in_directory(const std::string& dir, const std::string& name,
                                              const std::string& what) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", escape_control_bytes(name), "\" ", why));
  };
  if (name.empty()) return refuse("is empty");
  if (name.find('/') != std::string::npos || name == "." || name == "..")
    return refuse(absl::StrCat("is not a plain file name inside ", dir));
  if (name.find('\0') != std::string::npos) return refuse("holds a NUL byte");
  const fs::path path = fs::path(dir) / name;
  std::error_code ec;
  const fs::path real_dir = fs::canonical(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  const fs::path real = fs::canonical(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path.string(), " (", what, "): no such file"));
  const std::vector<fs::path> allowed = resolution_directories(real_dir);
  if (std::find(allowed.begin(), allowed.end(), real.parent_path()) == allowed.end())
    return refuse(absl::StrCat("leads outside ", dir, " (to ", real.string(), ")"));
  SY_RETURN_IF_ERROR(regular_file_size(path.string()).status());
  return path.string();
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::open(const std::string& path) {
  const std::string partial = path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP) return link_refused(partial);
  if (fd < 0)
    return absl::PermissionDeniedError(absl::StrCat(partial, ": cannot write: ", errno_reason()));
  return AtomicFileWriter(path, fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(partial().c_str());
}

absl::Status AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already committed"));
  return write_all(fd_, std::string_view(static_cast<const char*>(data), bytes), partial());
}

absl::Status AtomicFileWriter::commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already committed"));
  const int fd = std::exchange(fd_, -1);
  const bool synced = ::fsync(fd) == 0;
  const std::string sync_error = synced ? "" : errno_reason();
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    ::unlink(partial().c_str());
    return absl::DataLossError(absl::StrCat(partial(), ": write failed: ",
                                            synced ? errno_reason() : sync_error));
  }
  if (::rename(partial().c_str(), path_.c_str()) != 0) {
    const std::string why = errno_reason();
    ::unlink(partial().c_str());
    return absl::DataLossError(absl::StrCat(path_, ": cannot rename into place: ", why));
  }
  const fs::path parent = fs::path(path_).parent_path();
  return fsync_path(parent.empty() ? "." : parent.string());
}

absl::Status write_file_atomically(const std::string& path, std::string_view bytes) {
  SY_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::open(path));
  SY_RETURN_IF_ERROR(out.write(bytes));
  return out.commit();
}

absl::Status copy_file_atomically(const std::string& from, const std::string& to) {
  int64_t size = 0;
  SY_ASSIGN_OR_RETURN(const int raw_fd, open_regular(from, &size));
  Fd in(raw_fd);
  SY_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::open(to));
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(from, ": read error: ", errno_reason()));
    if (n == 0) break;
    SY_RETURN_IF_ERROR(out.write(buffer.data(), static_cast<size_t>(n)));
  }
  return out.commit();
}

std::string errno_reason() { return errno == 0 ? "no reason given" : std::strerror(errno); }

absl::Status fsync_path(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0)
    return absl::DataLossError(absl::StrCat(path, ": cannot open to sync: ", errno_reason()));
  if (::fsync(fd.get()) != 0)
    return absl::DataLossError(absl::StrCat(path, ": fsync failed: ", errno_reason()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> total_file_bytes(const std::vector<std::string>& paths) {
  int64_t total = 0;
  for (const std::string& path : paths) {
    const absl::StatusOr<int64_t> size = regular_file_size(path);
    if (!size.ok()) return absl::NotFoundError(absl::StrCat(path, ": no such input file"));
    total += *size;
  }
  return total;
}

}  // namespace switchyard
