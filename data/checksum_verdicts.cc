#include "data/checksum_verdicts.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/corpus_cache.h"
#include "data/sha256.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// The file's identity and version, or nullopt when it cannot be read.
std::optional<std::string> file_version(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec);
}

std::string verdict_path(const std::string& cache_dir, const std::string& version,
                         const std::string& expected_sha256) {
  return (fs::path(cache_dir) / sha256_hex(absl::StrCat(version, " ", expected_sha256))).string();
}

void record_verdict(const std::string& cache_dir, const std::string& path,
                    const std::string& version, const std::string& expected_sha256) {
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) return;
  write_file_atomically(verdict_path(cache_dir, version, expected_sha256),
                        absl::StrCat(path, " ", version, " ", expected_sha256, "\n"))
      .IgnoreError();
}

}  // namespace

std::string default_verdict_cache_dir() {
  return (fs::path(default_dataset_cache_dir()) / "verified-shards").string();
}

absl::Status verify_file_sha256(const std::string& path, const std::string& expected_sha256,
                                const std::string& cache_dir) {
  const std::optional<std::string> before = file_version(path);
  std::error_code ec;
  if (!cache_dir.empty() && before &&
      fs::is_regular_file(verdict_path(cache_dir, *before, expected_sha256), ec))
    return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(const std::string sha, sha256_file(path));
  if (sha != expected_sha256)
    return absl::DataLossError(absl::StrCat(path, ": sha256 ", sha, " does not match the index (",
                                            expected_sha256, "); the shard is corrupted"));
  if (!cache_dir.empty() && before && file_version(path) == before)
    record_verdict(cache_dir, path, *before, expected_sha256);
  return absl::OkStatus();
}

}  // namespace switchyard
