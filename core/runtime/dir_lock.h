// One writer at a time in an output directory: an exclusive advisory lock (flock) on a
// file inside it, held for a command's whole run. docs/launch.md says what it does on
// shared file systems, docs/security.md what it promises.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace switchyard {

// The lock file of a directory that one command writes as a whole (a run directory, a
// dataset, a conversion's output).
inline constexpr char kDirLockName[] = ".switchyard.lock";
// The most bytes of a lock file read for its holder's identity; a larger file is not one
// the engine wrote, and its holder is reported unknown.
inline constexpr int64_t kMaxLockFileBytes = 4096;
// Set to 1, a file system that cannot lock (ENOLCK, EOPNOTSUPP, ENOSYS) is written without
// the lock, with a warning, where it is otherwise refused.
inline constexpr char kAllowUnlockedEnv[] = "SWITCHYARD_ALLOW_UNLOCKED";

// The lock, held from acquire() until release() or destruction, or until its process dies
// (the kernel releases it then, and the next writer takes it over without help). The
// holder's identity is in the file: host, pid, start time (UTC) and command line. Releasing
// removes the file, so a finished command leaves the directory as it wrote it.
class DirLock {
 public:
  // Creates `dir` when missing and locks `dir`/`name`. Another holder is refused in one
  // line naming `dir` and the holder; a lock file that is a symlink or not a regular file
  // is refused. Where the file system cannot lock, refused unless SWITCHYARD_ALLOW_UNLOCKED
  // is 1: then an unheld DirLock is returned and `warning` says so.
  static absl::StatusOr<DirLock> acquire(const std::string& dir, std::string* warning,
                                         const std::string& name = kDirLockName);

  DirLock() = default;  // holds nothing
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() { release(); }

  bool held() const { return fd_ >= 0; }
  // Removes the lock file and unlocks; a directory that acquire() created goes too when
  // nothing else is in it.
  void release();

 private:
  DirLock(std::string dir, std::string name, int dir_fd, int fd, bool created_dir)
      : dir_(std::move(dir)),
        name_(std::move(name)),
        dir_fd_(dir_fd),
        fd_(fd),
        created_dir_(created_dir) {}
  std::string dir_;
  std::string name_;
  int dir_fd_ = -1;
  int fd_ = -1;
  bool created_dir_ = false;
};

// "host H, pid P, since T, command: C" from a lock file's bytes (untrusted: any bytes),
// or "holder unknown (...)" when they are not an identity the engine writes.
std::string describe_lock_holder(std::string_view bytes);

}  // namespace switchyard
