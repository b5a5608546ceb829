// One writer at a time: a second DirLock on a directory (another open file description, as
// another process would have) is refused naming the holder; a released lock is taken again;
// a symlinked or foreign lock file is handled without trusting its bytes.
#include "core/runtime/dir_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

class DirLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "switchyard-dir-lock-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path dir() const { return root_ / "run"; }
  fs::path lock_file() const { return dir() / kDirLockName; }
  static std::string message_of(const absl::StatusOr<DirLock>& lock) {
    return lock.ok() ? "acquired" : std::string(lock.status().message());
  }
  static std::string contents(const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path root_;
};

TEST_F(DirLockTest, SecondWriterIsRefusedNamingTheHolder) {
  absl::StatusOr<DirLock> first = DirLock::acquire(dir().string(), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->held());
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);

  const std::string refused = message_of(DirLock::acquire(dir().string(), nullptr));
  EXPECT_EQ(refused.find('\n'), std::string::npos) << refused;
  EXPECT_EQ(refused.rfind(dir().string() + ": in use by another writer (host ", 0), 0) << refused;
  EXPECT_NE(refused.find(absl::StrCat("host ", host, ", pid ", getpid(), ", since 20")),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("Z, command: "), std::string::npos) << refused;
  EXPECT_NE(refused.find("dir_lock_test"), std::string::npos) << refused;  // the command
  EXPECT_NE(refused.find(lock_file().string()), std::string::npos) << refused;
}

TEST_F(DirLockTest, ReleasedLockIsTakenAgainAndLeavesNoFile) {
  fs::create_directories(dir());
  {
    absl::StatusOr<DirLock> first = DirLock::acquire(dir().string(), nullptr);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(fs::exists(lock_file()));
    first->release();
    EXPECT_FALSE(first->held());
    EXPECT_FALSE(fs::exists(lock_file()));
    EXPECT_TRUE(fs::is_directory(dir()));  // it existed before: kept
  }
  absl::StatusOr<DirLock> second = DirLock::acquire(dir().string(), nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  // Moved, the lock stays held once; destroyed, it is released.
  DirLock moved = std::move(*second);
  EXPECT_TRUE(moved.held());
  EXPECT_EQ(
      message_of(DirLock::acquire(dir().string(), nullptr)).rfind(dir().string() + ": in use", 0),
      0u);
  moved = DirLock();
  EXPECT_TRUE(DirLock::acquire(dir().string(), nullptr).ok());
}

TEST_F(DirLockTest, DirectoryItCreatedGoesWhenEmpty) {
  {
    absl::StatusOr<DirLock> lock = DirLock::acquire(dir().string(), nullptr);
    ASSERT_TRUE(lock.ok()) << lock.status();
  }
  EXPECT_FALSE(fs::exists(dir()));
  {
    absl::StatusOr<DirLock> lock = DirLock::acquire(dir().string(), nullptr);
    ASSERT_TRUE(lock.ok()) << lock.status();
    std::ofstream(dir() / "metrics.jsonl") << "{}\n";
  }
  EXPECT_TRUE(fs::exists(dir() / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(lock_file()));
}

TEST_F(DirLockTest, LockFileOfAKilledHolderIsTakenOver) {
  // What a holder that died leaves: its identity, no lock.
  fs::create_directories(dir());
  std::ofstream(lock_file()) << R"({"host":"elsewhere","pid":1,"started":"x","command":"y"})";
  absl::StatusOr<DirLock> lock = DirLock::acquire(dir().string(), nullptr);
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_NE(contents(lock_file()).find(absl::StrCat("\"pid\":", getpid())), std::string::npos)
      << contents(lock_file());
}

TEST_F(DirLockTest, LockOfAnotherProcessIsRefusedUntilItIsKilled) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const absl::StatusOr<DirLock> lock = DirLock::acquire(dir().string(), nullptr);
    const char byte = lock.ok() ? 'y' : 'n';
    if (write(ready[1], &byte, 1) != 1 || !lock.ok()) _exit(1);
    for (;;) pause();
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  const std::string refused = message_of(DirLock::acquire(dir().string(), nullptr));
  EXPECT_NE(refused.find(absl::StrCat(", pid ", child, ", since ")), std::string::npos) << refused;
  // Killed, the child leaves its lock file behind, unlocked: the next writer takes it over.
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(fs::exists(lock_file()));
  EXPECT_TRUE(DirLock::acquire(dir().string(), nullptr).ok());
  close(ready[0]);
  close(ready[1]);
}

TEST_F(DirLockTest, SymlinkedLockFileIsRefused) {
  fs::create_directories(dir());
  std::ofstream(root_ / "elsewhere") << "keep";
  fs::create_symlink(root_ / "elsewhere", lock_file());
  const std::string refused = message_of(DirLock::acquire(dir().string(), nullptr));
  EXPECT_EQ(refused, lock_file().string() +
                         ": is a symbolic link; a lock file must be a plain file in the directory");
  EXPECT_EQ(contents(root_ / "elsewhere"), "keep");
  // A dangling one is not created through either.
  fs::remove(lock_file());
  fs::create_symlink(root_ / "created", lock_file());
  EXPECT_FALSE(DirLock::acquire(dir().string(), nullptr).ok());
  EXPECT_FALSE(fs::exists(root_ / "created"));
}

TEST_F(DirLockTest, LockFileThatIsNotARegularFileIsRefused) {
  fs::create_directories(lock_file());
  EXPECT_EQ(message_of(DirLock::acquire(dir().string(), nullptr)),
            lock_file().string() + ": is not a regular file");
  fs::remove(lock_file());
  ASSERT_EQ(mkfifo(lock_file().c_str(), 0600), 0);
  EXPECT_EQ(message_of(DirLock::acquire(dir().string(), nullptr)),
            lock_file().string() + ": is not a regular file");
}

TEST_F(DirLockTest, ForeignLockFileBytesAreDescribedSafely) {
  const std::string unknown =
      "holder unknown: its lock file is being written or is not one the engine wrote";
  EXPECT_EQ(describe_lock_holder(""), unknown);
  EXPECT_EQ(describe_lock_holder(R"({"host":"a","pid":12,"sta)"), unknown);  // half-written
  EXPECT_EQ(describe_lock_holder(std::string(1 << 20, '\xff')), unknown);
  EXPECT_EQ(describe_lock_holder(std::string(100000, '[')), unknown);
  EXPECT_EQ(describe_lock_holder("[1,2]"), unknown);
  // An oversized file is not read past the bound, even when it starts as an identity.
  EXPECT_EQ(describe_lock_holder(R"({"host":")" + std::string(8000, 'h') + R"("})"), unknown);
  // Wrong types, out-of-range pids and control bytes.
  EXPECT_EQ(describe_lock_holder(R"({"host":7,"pid":-3,"started":null})"),
            "host ?, pid ?, since ?, command: ?");
  EXPECT_EQ(describe_lock_holder(R"({"pid":99999999999999999999})"),
            "host ?, pid ?, since ?, command: ?");
  EXPECT_EQ(describe_lock_holder(R"({"pid":1e3,"command":"a\nb\u001b[2J"})"),
            "host ?, pid ?, since ?, command: a\\x0ab\\x1b[2J");
  EXPECT_EQ(
      describe_lock_holder(
          R"({"host":"h","pid":42,"started":"2026-01-02T03:04:05Z","command":"switchyard train r"})"),
      "host h, pid 42, since 2026-01-02T03:04:05Z, command: switchyard train r");
}

TEST_F(DirLockTest, GarbageLockFileHeldByAnotherWriterNamesNoHolder) {
  absl::StatusOr<DirLock> first = DirLock::acquire(dir().string(), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  // The file's bytes replaced in place (the holder's fd still locks the same file).
  std::ofstream(lock_file(), std::ios::trunc) << std::string(10000, '\x01');
  const std::string refused = message_of(DirLock::acquire(dir().string(), nullptr));
  EXPECT_NE(refused.find("in use by another writer (holder unknown"), std::string::npos) << refused;
}

}  // namespace
}  // namespace switchyard
