// The paths a command writes, checked against the paths it reads before it writes
// anything: an output never is, lies inside or contains an input, and never replaces a file
// the command did not write. Every command that writes calls check_outputs once.
// docs/security.md ("Nothing the user owns is destroyed") says what it promises.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace switchyard {

// A path the command reads; `option` names it in messages ("--input", "train.init_from").
struct InputPath {
  std::string option;
  std::string path;
  // Written by an earlier run of the same output (the run's own checkpoint it resumes):
  // the output may contain it.
  bool owned = false;
};

// The inputs a command reads, each option with its paths; empty paths (not given) are left
// out.
std::vector<InputPath> input_paths(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& options);

// A path the command writes: one file or one directory.
struct OutputPath {
  std::string option;
  std::string path;
  bool directory = false;
  // A file: what the command writes there ("tokenizer model"), and whether an existing
  // file is one; only such a file is replaced, and only with --overwrite.
  std::string kind;
  std::function<bool(const std::string&)> is_kind;
  // A directory: the entries inside it that the command writes; empty, the whole directory.
  // An input inside one of them is refused.
  std::vector<std::string> writes;
  // A directory: an existing one that holds anything but the lock file needs --overwrite.
  bool must_be_empty = false;
};

OutputPath output_file(std::string option, std::string path, std::string kind,
                       std::function<bool(const std::string&)> is_kind);
OutputPath output_directory(std::string option, std::string path,
                            std::vector<std::string> writes = {}, bool must_be_empty = false);

// Refuses, in one line naming both paths (symlinks followed): an output that is an input,
// lies inside an input directory, or contains an input (in the entries it writes) that is
// not `owned`; two outputs that are one path; an existing file in a file output's place
// unless `overwrite` and it is of the output's kind; an existing non-directory in a
// directory output's place; a non-empty `must_be_empty` directory unless `overwrite`.
absl::Status check_outputs(const std::vector<InputPath>& inputs,
                           const std::vector<OutputPath>& outputs, bool overwrite);

class DirLock;

// A directory output written whole, so that it is complete or absent: the command writes
// into a temporary sibling directory in the output's parent (".NAME.partial-N", beside the
// output with its symlinks followed), and commit() renames it into place. Destroyed
// uncommitted (a refusal, a failed write), it removes the temporary, and the output is as
// it was. A temporary left by a writer that died is removed by the next one, which holds
// the output's lock.
class StagedDirectory {
 public:
  // Call with the output's lock (core/runtime/dir_lock.h) held.
  static absl::StatusOr<StagedDirectory> create(const std::string& out);

  StagedDirectory(StagedDirectory&& other) noexcept;
  StagedDirectory& operator=(StagedDirectory&&) = delete;
  StagedDirectory(const StagedDirectory&) = delete;
  ~StagedDirectory();

  // Where the command writes its files.
  const std::string& path() const { return staging_; }

  // Puts the written files in place. An output that holds nothing but `lock`'s file (one
  // the lock created) is exchanged with the temporary in one rename, and `lock` is
  // released. Otherwise (an earlier output kept by --overwrite, or a file system without
  // renameat2's exchange) the files of the output that `owned` names and the new output
  // lacks are removed and each new file is renamed over its namesake: every file whole,
  // the other files kept.
  absl::Status commit(bool (*owned)(std::string_view), DirLock& lock);

 private:
  StagedDirectory(std::string out, std::string staging)
      : out_(std::move(out)), staging_(std::move(staging)) {}
  std::string out_;
  std::string staging_;  // empty once committed or moved from
};

// Kinds of file: a JSON object holding every one of `fields`; a file that begins with
// `prefix`.
bool is_json_object_with(const std::string& path, const std::vector<std::string>& fields);
bool file_starts_with(const std::string& path, const std::string& prefix);

// Refuses `path` inside the directory `dir` when it is a symbolic link, naming it: files
// inside a run directory are never followed out of it.
absl::Status refuse_symlink(const std::string& path, const std::string& dir);

}  // namespace switchyard
