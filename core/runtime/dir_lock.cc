#include "core/runtime/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"
#include "core/runtime/text.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// How often acquire() opens the lock file again when a releasing holder removed it between
// our open and our lock.
constexpr int kAcquireAttempts = 16;
// The most bytes of the command line recorded.
constexpr size_t kMaxCommandBytes = 2048;

// An fd closed when it goes out of scope, unless released.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char text[32] = {};
  if (::gmtime_r(&now, &tm) == nullptr ||
      std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    return "unknown";
  return text;
}

// This process's arguments joined by spaces, at most kMaxCommandBytes of them.
std::string command_line() {
  const UniqueFd fd(::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC));
  std::string text(kMaxCommandBytes, '\0');
  const ssize_t n = fd.get() < 0 ? -1 : ::read(fd.get(), text.data(), text.size());
  if (n <= 0) return "unknown";
  text.resize(static_cast<size_t>(n));
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text)
    if (c == '\0') c = ' ';
  if (static_cast<size_t>(n) == kMaxCommandBytes) text += "...";
  return text;
}

// The identity a holder writes into its lock file: one JSON object, within
// kMaxLockFileBytes whatever the command line holds.
std::string identity_text() {
  nlohmann::json j;
  j["host"] = host_name();
  j["pid"] = static_cast<int64_t>(::getpid());
  j["started"] = utc_now();
  j["command"] = command_line();
  const auto dump = [&] {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string text = dump();
  if (text.size() + 1 > static_cast<size_t>(kMaxLockFileBytes)) {
    j["command"] = "(too long to record)";
    text = dump();
  }
  return text + "\n";
}

absl::Status write_identity(int fd, const std::string& path) {
  const std::string text = identity_text();
  if (::ftruncate(fd, 0) != 0)
    return absl::DataLossError(absl::StrCat(path, ": cannot write: ", errno_reason()));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::DataLossError(absl::StrCat(path, ": cannot write: ", errno_reason()));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// At most kMaxLockFileBytes + 1 bytes of the lock file (one more than allowed, so that a
// larger file shows); empty when it cannot be read.
std::string read_lock_file(int fd) {
  std::string bytes(static_cast<size_t>(kMaxLockFileBytes) + 1, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return "";
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// Whether `name` in the directory is still the file `fd` has open: a holder removes the
// file as it releases, so a lock taken on a file opened just before is on a removed one.
bool still_linked(int dir_fd, const std::string& name, int fd) {
  struct stat open_file, named;
  return ::fstat(fd, &open_file) == 0 && open_file.st_nlink > 0 &&
         ::fstatat(dir_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
         named.st_dev == open_file.st_dev && named.st_ino == open_file.st_ino;
}

// Creates `dir` when missing (`created` says whether it did) and opens it.
absl::StatusOr<UniqueFd> open_directory(const std::string& dir, bool* created) {
  std::error_code ec;
  *created = fs::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create the directory: ", ec.message()));
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0)
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot open: ", errno_reason()));
  return fd;
}

// Opens (creating it) the lock file `name` inside the directory, never through a symlink;
// NotFound when the directory was removed meanwhile.
absl::StatusOr<UniqueFd> open_lock_file(int dir_fd, const std::string& name,
                                        const std::string& path) {
  UniqueFd fd(::openat(dir_fd, name.c_str(),
                       O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644));
  if (fd.get() < 0 && errno == ELOOP)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is a symbolic link; a lock file must be a plain file in the directory"));
  if (fd.get() < 0 && errno == ENOENT)
    return absl::NotFoundError(absl::StrCat(path, ": the directory was removed"));
  if (fd.get() < 0 && errno != EISDIR)
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", errno_reason()));
  struct stat st;
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, ": is not a regular file"));
  return fd;
}

// Whether flock's errno says that the file system cannot lock at all.
bool cannot_lock(int error) { return error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS; }

bool unlocked_allowed() {
  const char* value = std::getenv(kAllowUnlockedEnv);
  return value != nullptr && std::string_view(value) == "1";
}

// The refusal, or with SWITCHYARD_ALLOW_UNLOCKED=1 the warning, where locking failed.
absl::StatusOr<DirLock> lock_failed(int error, const std::string& reason, const std::string& dir,
                                    const std::string& path, int fd, std::string* warning) {
  if (error == EWOULDBLOCK)
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": in use by another writer (", describe_lock_holder(read_lock_file(fd)),
        "); one writer at a time: wait for it to end, or choose another directory (lock file ",
        path, ")"));
  if (!cannot_lock(error))
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot lock: ", reason));
  const std::string what = absl::StrCat(dir, ": the file system cannot lock ", path, " (", reason,
                                        "), so nothing would keep a second writer out");
  if (!unlocked_allowed())
    return absl::FailedPreconditionError(
        absl::StrCat(what, "; write elsewhere, or set ", kAllowUnlockedEnv,
                     "=1 to write without the lock (docs/launch.md)"));
  if (warning != nullptr)
    *warning = absl::StrCat("warning: ", what, "; writing without the lock as ", kAllowUnlockedEnv,
                            "=1 asks");
  return DirLock();
}

// A string field of an identity, at most `max` bytes of it, control bytes escaped.
std::string identity_field(const nlohmann::json& j, const char* key, size_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "?";
  const std::string& value = it->get_ref<const std::string&>();
  return escape_control_bytes(value.size() <= max ? value : value.substr(0, max) + "...");
}

std::string identity_pid(const nlohmann::json& j) {
  const auto it = j.find("pid");
  if (it == j.end() || !it->is_number_unsigned()) return "?";
  const uint64_t pid = it->get<uint64_t>();
  return pid >= 1 && pid <= 0x7fffffff ? absl::StrCat(pid) : "?";
}

}  // namespace

std::string describe_lock_holder(std::string_view bytes) {
  const std::string unknown =
      "holder unknown: its lock file is being written or is not one the engine wrote";
  if (bytes.size() > static_cast<size_t>(kMaxLockFileBytes)) return unknown;
  const absl::StatusOr<nlohmann::json> j = parse_json_object(bytes, "lock file", 2);
  if (!j.ok()) return unknown;
  return absl::StrCat("host ", identity_field(*j, "host", 256), ", pid ", identity_pid(*j),
                      ", since ", identity_field(*j, "started", 64),
                      ", command: ", identity_field(*j, "command", kMaxCommandBytes));
}

absl::StatusOr<DirLock> DirLock::acquire(const std::string& dir, std::string* warning,
                                         const std::string& name) {
  const std::string path = (fs::path(dir) / name).string();
  for (int attempt = 0; attempt < kAcquireAttempts; ++attempt) {
    bool created = false;
    SY_ASSIGN_OR_RETURN(UniqueFd dir_fd, open_directory(dir, &created));
    absl::StatusOr<UniqueFd> fd = open_lock_file(dir_fd.get(), name, path);
    if (absl::IsNotFound(fd.status())) continue;  // a releasing holder removed the directory
    if (!fd.ok()) return fd.status();
    if (::flock(fd->get(), LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      return lock_failed(error, errno_reason(), dir, path, fd->get(), warning);
    }
    if (!still_linked(dir_fd.get(), name, fd->get())) continue;  // released as we opened it
    SY_RETURN_IF_ERROR(write_identity(fd->get(), path));
    return DirLock(dir, name, dir_fd.release(), fd->release(), created);
  }
  return absl::UnavailableError(
      absl::StrCat(path, ": the lock file was replaced ", kAcquireAttempts,
                   " times as this process took it; another process keeps removing it"));
}

DirLock::DirLock(DirLock&& other) noexcept
    : dir_(std::move(other.dir_)),
      name_(std::move(other.name_)),
      dir_fd_(std::exchange(other.dir_fd_, -1)),
      fd_(std::exchange(other.fd_, -1)),
      created_dir_(other.created_dir_) {}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this == &other) return *this;
  release();
  dir_ = std::move(other.dir_);
  name_ = std::move(other.name_);
  dir_fd_ = std::exchange(other.dir_fd_, -1);
  fd_ = std::exchange(other.fd_, -1);
  created_dir_ = other.created_dir_;
  return *this;
}

void DirLock::release() {
  if (fd_ < 0) return;
  // Removed while still locked: a writer that opened it meanwhile finds it removed once it
  // has the lock, and opens the next one (acquire's still_linked).
  if (still_linked(dir_fd_, name_, fd_)) ::unlinkat(dir_fd_, name_.c_str(), 0);
  ::close(fd_);
  ::close(dir_fd_);
  if (created_dir_) ::rmdir(dir_.c_str());  // only when empty
  fd_ = dir_fd_ = -1;
}

}  // namespace switchyard
