#include "data/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::move(buffer).str();
}

absl::Status fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return absl::InternalError(absl::StrCat(path, ": cannot open to sync: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat(path, ": fsync failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(partial, ": cannot write"));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return absl::DataLossError(absl::StrCat(partial, ": write failed (disk full?)"));
  }
  SY_RETURN_IF_ERROR(fsync_path(partial));
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat(path, ": cannot rename into place: ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> total_file_bytes(const std::vector<std::string>& paths) {
  int64_t total = 0;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return absl::NotFoundError(absl::StrCat(path, ": no such input file"));
    total += static_cast<int64_t>(fs::file_size(path, ec));
  }
  return total;
}

}  // namespace switchyard
