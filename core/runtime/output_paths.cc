#include "core/runtime/output_paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/runtime/dir_lock.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// `path` absolute, with every symlink followed as far as it exists, without a trailing
// separator.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

// Whether the resolved path `inner` is `outer` or lies inside it.
bool is_within(const fs::path& inner, const fs::path& outer) {
  return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first == outer.end();
}

absl::Status refused(const OutputPath& out, const std::string& relation, const InputPath& in) {
  return absl::InvalidArgumentError(absl::StrCat(out.option, " ", out.path, " ", relation, " ",
                                                 in.path, " (", in.option,
                                                 "): choose another output"));
}

// The places an output writes: the file, the whole directory, or the entries it names.
std::vector<fs::path> written_places(const OutputPath& out, const fs::path& real_out) {
  if (out.writes.empty()) return {real_out};
  std::vector<fs::path> places;
  for (const std::string& entry : out.writes)
    places.push_back(resolved((fs::path(out.path) / entry).string()));
  return places;
}

absl::Status check_against_input(const OutputPath& out, const fs::path& real_out,
                                 const InputPath& in) {
  const fs::path real_in = resolved(in.path);
  if (real_in == real_out) return refused(out, "is the input", in);
  if (is_within(real_out, real_in)) return refused(out, "lies inside the input", in);
  if (in.owned) return absl::OkStatus();
  for (const fs::path& place : written_places(out, real_out))
    if (is_within(real_in, place)) return refused(out, "contains the input", in);
  return absl::OkStatus();
}

absl::Status check_existing_file(const OutputPath& out, bool overwrite) {
  std::error_code ec;
  const fs::file_status status = fs::status(out.path, ec);
  if (!fs::exists(status)) return absl::OkStatus();
  const std::string named = absl::StrCat(out.option, " ", out.path);
  if (fs::is_directory(status))
    return absl::InvalidArgumentError(absl::StrCat(named, " is a directory: name a file"));
  if (!overwrite)
    return absl::AlreadyExistsError(absl::StrCat(named,
                                                 " exists: --overwrite replaces it if it is a ",
                                                 out.kind, "; or choose another output"));
  if (!out.is_kind(out.path))
    return absl::FailedPreconditionError(absl::StrCat(named, " exists and is not a ", out.kind,
                                                      ": --overwrite replaces only a ", out.kind,
                                                      "; choose another output"));
  return absl::OkStatus();
}

// Whether the directory `dir` holds anything but its lock file.
bool holds_files(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename() != kDirLockName) return true;
  return false;
}

absl::Status check_existing_directory(const OutputPath& out, bool overwrite) {
  std::error_code ec;
  const fs::file_status status = fs::status(out.path, ec);
  if (!fs::exists(status)) return absl::OkStatus();
  if (!fs::is_directory(status))
    return absl::InvalidArgumentError(
        absl::StrCat(out.option, " ", out.path, " exists and is not a directory"));
  if (out.must_be_empty && !overwrite && holds_files(out.path))
    return absl::FailedPreconditionError(
        absl::StrCat(out.option, " ", out.path,
                     ": the output directory is not empty; --overwrite replaces the files of "
                     "this command's kind there and keeps the others"));
  return absl::OkStatus();
}

// The names of the entries of the directory `dir`.
absl::StatusOr<std::vector<std::string>> entry_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat(dir.string(), ": cannot list: ", ec.message()));
  return names;
}

absl::Status cannot(const std::string& what, const fs::path& path, const std::string& reason) {
  return absl::PermissionDeniedError(absl::StrCat(path.string(), ": cannot ", what, ": ", reason));
}

// Moves the entries of `staging` into `out`, each renamed over its namesake, after removing
// the files of `out` that `owned` names and `staging` lacks.
absl::Status move_entries(const fs::path& staging, const fs::path& out,
                          bool (*owned)(std::string_view)) {
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> fresh, entry_names(staging));
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> earlier, entry_names(out));
  const std::set<std::string> replaced(fresh.begin(), fresh.end());
  std::error_code ec;
  for (const std::string& name : earlier) {
    const fs::path entry = out / name;
    if (!owned(name) || replaced.count(name) || fs::is_directory(fs::symlink_status(entry, ec)))
      continue;
    if (!fs::remove(entry, ec) && ec) return cannot("remove", entry, ec.message());
  }
  for (const std::string& name : fresh) {
    fs::rename(staging / name, out / name, ec);
    if (ec) return cannot("move into place", out / name, ec.message());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StagedDirectory> StagedDirectory::create(const std::string& out) {
  const fs::path real = resolved(out);
  const fs::path parent = real.parent_path();
  const std::string prefix = absl::StrCat(".", real.filename().string(), ".partial-");
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> siblings, entry_names(parent));
  std::error_code ec;
  for (const std::string& name : siblings) {
    const fs::path stale = parent / name;
    if (name.starts_with(prefix) && fs::is_directory(fs::symlink_status(stale, ec)))
      fs::remove_all(stale, ec);
  }
  for (int attempt = 0;; ++attempt) {
    const fs::path staging = parent / absl::StrCat(prefix, ::getpid(), "-", attempt);
    if (::mkdir(staging.c_str(), 0777) == 0) return StagedDirectory(real.string(), staging.string());
    if (errno != EEXIST) return cannot("create", staging, std::strerror(errno));
  }
}

StagedDirectory::StagedDirectory(StagedDirectory&& other) noexcept
    : out_(std::move(other.out_)), staging_(std::exchange(other.staging_, std::string())) {}

StagedDirectory::~StagedDirectory() {
  if (staging_.empty()) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

absl::Status StagedDirectory::commit(bool (*owned)(std::string_view), DirLock& lock) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out_, ec))) {
    fs::rename(staging_, out_, ec);
    if (ec) return cannot("move into place", out_, ec.message());
    staging_.clear();
    return absl::OkStatus();
  }
  if (!holds_files(out_)) {
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) == 0) {
      // The temporary's name now holds the earlier output: nothing but the lock file.
      lock.release();
      const fs::path earlier = staging_;
      staging_.clear();
      fs::remove(earlier / kDirLockName, ec);
      fs::remove(earlier, ec);
      return absl::OkStatus();
    }
    if (errno != EINVAL && errno != ENOSYS) return cannot("move into place", out_, std::strerror(errno));
  }
  SY_RETURN_IF_ERROR(move_entries(staging_, out_, owned));
  fs::remove(staging_, ec);
  staging_.clear();
  return absl::OkStatus();
}

std::vector<InputPath> input_paths(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& options) {
  std::vector<InputPath> inputs;
  for (const auto& [option, paths] : options)
    for (const std::string& path : paths)
      if (!path.empty()) inputs.push_back({option, path});
  return inputs;
}

OutputPath output_file(std::string option, std::string path, std::string kind,
                       std::function<bool(const std::string&)> is_kind) {
  OutputPath out;
  out.option = std::move(option);
  out.path = std::move(path);
  out.kind = std::move(kind);
  out.is_kind = std::move(is_kind);
  return out;
}

OutputPath output_directory(std::string option, std::string path, std::vector<std::string> writes,
                            bool must_be_empty) {
  OutputPath out;
  out.option = std::move(option);
  out.path = std::move(path);
  out.directory = true;
  out.writes = std::move(writes);
  out.must_be_empty = must_be_empty;
  return out;
}

absl::Status check_outputs(const std::vector<InputPath>& inputs,
                           const std::vector<OutputPath>& outputs, bool overwrite) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const OutputPath& out = outputs[i];
    const fs::path real_out = resolved(out.path);
    for (const InputPath& in : inputs) SY_RETURN_IF_ERROR(check_against_input(out, real_out, in));
    for (size_t j = 0; j < i; ++j)
      if (resolved(outputs[j].path) == real_out)
        return absl::InvalidArgumentError(absl::StrCat(out.option, " ", out.path, " is also ",
                                                       outputs[j].option, " ", outputs[j].path,
                                                       ": choose another output"));
    SY_RETURN_IF_ERROR(out.directory ? check_existing_directory(out, overwrite)
                                     : check_existing_file(out, overwrite));
  }
  return absl::OkStatus();
}

bool is_json_object_with(const std::string& path, const std::vector<std::string>& fields) {
  const absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return false;
  const absl::StatusOr<nlohmann::json> j = parse_json_object(*text, path);
  return j.ok() && std::all_of(fields.begin(), fields.end(),
                               [&](const std::string& f) { return j->contains(f); });
}

bool file_starts_with(const std::string& path, const std::string& prefix) {
  const absl::StatusOr<std::string> text = read_file(path);
  return text.ok() && text->starts_with(prefix);
}

absl::Status refuse_symlink(const std::string& path, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return absl::OkStatus();
  const fs::path target = fs::read_symlink(path, ec);
  return absl::InvalidArgumentError(absl::StrCat(path, ": is a symbolic link (to ", target.string(),
                                                 "); files inside ", dir,
                                                 " are never followed out of it: remove the link"));
}

}  // namespace switchyard
