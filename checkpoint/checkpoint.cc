#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/str_cat.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "data/hdf5_reader.h"
#include "data/hdf5_writer.h"
#include "data/sha256.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// 2: rank files in the layout of data/hdf5_writer.h, read without libhdf5.
constexpr int kFormatVersion = 2;
constexpr char kManifestFile[] = "manifest.pb";
constexpr char kLatestFile[] = "latest";

std::string step_dir_name(int64_t step) { return absl::StrCat("step_", step); }

// N when `name` is exactly step_dir_name(N) for some N >= 0.
std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  constexpr size_t kMaxDigits = 18;  // below int64's range
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.empty() || digits.size() > kMaxDigits || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int64_t step = 0;
  for (const char c : digits) step = step * 10 + (c - '0');
  return step;
}

std::string slice_bytes_sha256(const Tensor& t) {
  return sha256_hex(std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes()));
}

// Creates the groups above the dataset `key` ("exp_avg/model.norm.weight") that `made`
// does not hold yet, with `group_creation`'s compact link storage.
absl::Status create_parent_groups(hid_t file, const std::string& key, const std::string& path,
                                  hid_t group_creation, std::set<std::string>& made) {
  for (size_t slash = key.find('/'); slash != std::string::npos;
       slash = key.find('/', slash + 1)) {
    const std::string group = key.substr(0, slash);
    if (group.empty() || !made.insert(group).second) continue;
    H5Handle created(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, group_creation, H5P_DEFAULT),
                     H5Gclose);
    if (!created.valid())
      return absl::DataLossError(
          absl::StrCat(path, ": cannot create group ", group, ": ", errno_reason()));
  }
  return absl::OkStatus();
}

// Writes this rank's slices into one HDF5 file and returns their manifest entries.
absl::StatusOr<std::vector<checkpoint::TensorSlice>> write_rank_file(
    const std::string& dir, const std::string& file, const std::vector<SliceToSave>& mine) {
  const std::string path = (fs::path(dir) / file).string();
  SY_ASSIGN_OR_RETURN(H5Handle h5, create_hdf5_file(path));
  const Hdf5WriteSettings settings = hdf5_write_settings();
  std::set<std::string> groups;
  // Hashing is the slow part of a save (SHA-256 runs below disk speed on one core):
  // the slices are hashed in parallel first.
  std::vector<std::string> digests(mine.size());
  const int64_t count = static_cast<int64_t>(mine.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < count; ++i) digests[i] = slice_bytes_sha256(mine[i].value);
  std::vector<checkpoint::TensorSlice> entries;
  std::set<std::string> datasets;
  for (size_t i = 0; i < mine.size(); ++i) {
    const SliceToSave& s = mine[i];
    // A rank may write several runs of one tensor's rows (experts under a placement):
    // each after the first gets a dataset of its own.
    const std::string dataset_name =
        datasets.insert(s.key).second ? s.key : absl::StrCat(s.key, ".rows_", s.first_row);
    const Shape& shape = s.value.shape();
    const std::vector<hsize_t> dims = shape.empty() ? std::vector<hsize_t>{1}
                                                    : std::vector<hsize_t>(shape.begin(), shape.end());
    H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                   H5Sclose);
    errno = 0;  // libhdf5's file driver leaves the OS's reason for a failure in errno
    SY_RETURN_IF_ERROR(
        create_parent_groups(h5.get(), s.key, path, settings.group_creation.get(), groups));
    H5Handle dataset(H5Dcreate2(h5.get(), dataset_name.c_str(), H5T_IEEE_F32LE, space.get(),
                                H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
    if (!dataset.valid() || H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                                     H5P_DEFAULT, s.value.raw_data()) < 0)
      return absl::DataLossError(
          absl::StrCat(path, ": cannot write ", s.key, ": ", errno_reason()));
    checkpoint::TensorSlice& e = entries.emplace_back();
    e.set_tensor(s.key);
    for (int64_t d : s.global_shape) e.add_global_shape(d);
    e.set_expert(s.expert);
    e.set_tensor_parallel_dim(s.tensor_parallel_dim);
    e.set_first_row(s.first_row);
    e.set_rows(s.value.shape().empty() ? 1 : s.value.dim(0));
    e.set_file(file);
    e.set_dataset(dataset_name);
    e.set_sha256(digests[i]);
  }
  errno = 0;
  if (!h5.reset())
    return absl::DataLossError(absl::StrCat(path, ": cannot finish writing: ", errno_reason()));
  SY_RETURN_IF_ERROR(fsync_path(path));
  return entries;
}

void prune(const std::string& checkpoints_dir, int64_t newest, int keep) {
  if (keep <= 0) return;
  std::vector<int64_t> steps = checkpoint_steps(checkpoints_dir);
  steps.erase(std::remove_if(steps.begin(), steps.end(), [&](int64_t s) { return s > newest; }),
              steps.end());
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i)
    fs::remove_all(fs::path(checkpoints_dir) / step_dir_name(steps[i]), ec);
}

}  // namespace

absl::StatusOr<std::string> save_checkpoint(const std::string& checkpoints_dir,
                                            const CheckpointContents& contents,
                                            const std::vector<SliceToSave>& mine, int keep,
                                            Communicator& world) {
  const int rank = world.rank();
  const std::string final_dir = (fs::path(checkpoints_dir) / step_dir_name(contents.step)).string();
  const std::string tmp_dir = final_dir + ".tmp";
  if (rank == 0) SY_RETURN_IF_ERROR(fresh_directory(tmp_dir));
  world.barrier();

  // Every rank writes its slices and their entries; rank 0 merges the entries.
  checkpoint::Manifest part;
  if (!mine.empty()) {
    SY_ASSIGN_OR_RETURN(auto entries,
                        write_rank_file(tmp_dir, absl::StrCat("rank_", rank, ".h5"), mine));
    for (auto& e : entries) *part.add_slices() = std::move(e);
  }
  SY_RETURN_IF_ERROR(write_file_atomically(
      (fs::path(tmp_dir) / absl::StrCat("rank_", rank, ".entries")).string(),
      part.SerializeAsString()));
  world.barrier();

  if (rank == 0) {
    checkpoint::Manifest manifest;
    manifest.set_format_version(kFormatVersion);
    *manifest.mutable_recipe() = contents.recipe;
    *manifest.mutable_layout() = contents.layout;
    manifest.set_step(contents.step);
    *manifest.mutable_loader() = contents.loader;
    manifest.set_elapsed_s(contents.elapsed_s);
    if (contents.lr_restart) *manifest.mutable_lr_restart() = *contents.lr_restart;
    for (int r = 0; r < world.size(); ++r) {
      const std::string entries_path =
          (fs::path(tmp_dir) / absl::StrCat("rank_", r, ".entries")).string();
      SY_ASSIGN_OR_RETURN(const std::string bytes, read_file(entries_path));
      checkpoint::Manifest rank_part;
      const google::protobuf::LogSilencer quiet;
      if (!rank_part.ParseFromString(bytes))
        return absl::DataLossError(absl::StrCat(entries_path, ": unreadable"));
      for (const auto& e : rank_part.slices()) *manifest.add_slices() = e;
      std::error_code ec;
      fs::remove(entries_path, ec);
    }
    SY_RETURN_IF_ERROR(write_file_atomically((fs::path(tmp_dir) / kManifestFile).string(),
                                             manifest.SerializeAsString()));
    SY_RETURN_IF_ERROR(fsync_path(tmp_dir));
    SY_RETURN_IF_ERROR(replace_directory(tmp_dir, final_dir));
    SY_RETURN_IF_ERROR(write_file_atomically((fs::path(checkpoints_dir) / kLatestFile).string(),
                                             step_dir_name(contents.step) + "\n"));
    prune(checkpoints_dir, contents.step, keep);
  }
  world.barrier();
  return final_dir;
}

std::vector<int64_t> checkpoint_steps(const std::string& checkpoints_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoints_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int64_t> step = parse_step_dir_name(it->path().filename().string());
    if (step && it->is_directory(ec) && !it->is_symlink(ec)) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  constexpr int64_t kMaxLatestBytes = 64;
  const std::string latest = (fs::path(checkpoints_dir) / kLatestFile).string();
  std::error_code ec;
  if (fs::symlink_status(latest, ec).type() == fs::file_type::not_found) return std::string();
  SY_RETURN_IF_ERROR(refuse_symlink(latest, checkpoints_dir));
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(latest, kMaxLatestBytes, Links::kRefuse));
  const std::optional<int64_t> step =
      !text.empty() && text.back() == '\n'
          ? parse_step_dir_name(std::string_view(text).substr(0, text.size() - 1))
          : std::nullopt;
  if (!step)
    return absl::DataLossError(
        absl::StrCat(latest, ": does not hold exactly one line step_<N> naming a checkpoint"));
  const fs::path dir = fs::path(checkpoints_dir) / step_dir_name(*step);
  const fs::path real_parent = fs::canonical(checkpoints_dir, ec);
  const fs::path real = ec ? fs::path() : fs::canonical(dir, ec);
  if (ec || !fs::is_directory(real, ec))
    return absl::DataLossError(absl::StrCat(latest, ": names ", step_dir_name(*step),
                                            ", which is not a directory in ", checkpoints_dir));
  if (real.parent_path() != real_parent)
    return absl::DataLossError(absl::StrCat(latest, ": names ", step_dir_name(*step),
                                            ", which leads outside ", checkpoints_dir, " (to ",
                                            real.string(), ")"));
  SY_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, read_manifest(dir.string()));
  if (manifest.step() != *step)
    return absl::DataLossError(absl::StrCat(latest, ": names ", step_dir_name(*step),
                                            ", whose manifest is at step ", manifest.step()));
  return dir.string();
}

std::string newest_complete_checkpoint(const std::string& checkpoints_dir, int64_t before) {
  for (const int64_t step : checkpoint_steps(checkpoints_dir)) {
    if (step >= before) continue;
    const std::string dir = (fs::path(checkpoints_dir) / step_dir_name(step)).string();
    const absl::StatusOr<checkpoint::Manifest> manifest = read_manifest(dir);
    if (manifest.ok() && manifest->step() == step && verify_checkpoint(dir, *manifest).ok())
      return dir;
  }
  return std::string();
}

absl::Status with_resume_hint(const absl::Status& problem, const std::string& checkpoints_dir,
                              int64_t before) {
  const std::string older = newest_complete_checkpoint(checkpoints_dir, before);
  const std::string hint =
      older.empty()
          ? "no complete checkpoint is left to resume from; train in another --run-dir"
          : absl::StrCat("the newest complete checkpoint is ", older,
                         ": resume from it with `switchyard train ... --resume-from ", older, "`");
  return absl::Status(problem.code(), absl::StrCat(problem.message(), "; ", hint));
}

absl::StatusOr<std::string> checkpoint_to_resume(const std::string& checkpoints_dir,
                                                 const std::string& resume_from) {
  constexpr int64_t kAnyStep = std::numeric_limits<int64_t>::max();
  if (!resume_from.empty()) return resume_from;
  const absl::StatusOr<std::string> latest = latest_checkpoint(checkpoints_dir);
  if (!latest.ok()) return with_resume_hint(latest.status(), checkpoints_dir, kAnyStep);
  const std::vector<int64_t> steps = checkpoint_steps(checkpoints_dir);
  if (!latest->empty() || steps.empty()) return *latest;
  // A kill between the first checkpoint's rename and the writing of `latest` leaves a
  // complete step directory and no `latest`: the newest step directory is taken when it
  // verifies whole, anything else is refused.
  const std::string newest = newest_complete_checkpoint(checkpoints_dir, kAnyStep);
  if (!newest.empty() && newest == (fs::path(checkpoints_dir) / step_dir_name(steps[0])).string())
    return newest;
  return with_resume_hint(
      absl::DataLossError(absl::StrCat(checkpoints_dir, ": holds step directories but no `",
                                       kLatestFile, "`, and the newest, ",
                                       step_dir_name(steps[0]), ", is not complete")),
      checkpoints_dir, kAnyStep);
}

namespace {

// The most dimensions a saved tensor has, and the longest tensor or dataset name.
constexpr int kMaxSliceRank = 8;
constexpr size_t kMaxNameBytes = 1024;

absl::Status field_error(const std::string& path, const std::string& field,
                         const std::string& why) {
  return absl::DataLossError(absl::StrCat(path, ": field ", field, " ", why));
}

std::string slice_field(int index, const char* name) {
  return absl::StrCat("slices[", index, "].", name);
}

Shape global_shape_of(const checkpoint::TensorSlice& slice) {
  return Shape(slice.global_shape().begin(), slice.global_shape().end());
}

// The shape of `slice`'s HDF5 dataset: its tensor's global shape with the slice's rows as
// dimension 0 (a scalar is saved as [1]).
Shape stored_shape_of(const checkpoint::TensorSlice& slice) {
  Shape shape(std::max(1, slice.global_shape_size()));
  for (int d = 1; d < slice.global_shape_size(); ++d) shape[d] = slice.global_shape(d);
  shape[0] = slice.rows();
  return shape;
}

// Dimension 0 of a tensor's global shape (a scalar is one row).
int64_t rows_of(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }

int64_t row_elements_of(const Shape& shape) {
  return shape.size() < 2 ? 1 : shape_numel(Shape(shape.begin() + 1, shape.end()));
}

int64_t slice_bytes(const checkpoint::TensorSlice& slice) {
  return slice.rows() * row_elements_of(global_shape_of(slice)) *
         static_cast<int64_t>(sizeof(float));
}

// A tensor or HDF5 dataset name as the writer makes them ("param/model.norm.weight"):
// printable, '/'-separated, no empty, "." or ".." component.
bool is_object_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != '/')
      return false;
  size_t begin = 0;
  while (begin <= name.size()) {
    const size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part(name.data() + begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    begin = end + 1;
  }
  return true;
}

bool is_sha256_hex(const std::string& digest) {
  return digest.size() == 64 && std::all_of(digest.begin(), digest.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// One slice on its own: names, shape, rows and checksum.
absl::Status check_slice(const checkpoint::TensorSlice& slice, int index, const std::string& path) {
  if (!is_object_name(slice.tensor()))
    return field_error(path, slice_field(index, "tensor"), "is not a tensor name");
  if (!is_object_name(slice.dataset()))
    return field_error(path, slice_field(index, "dataset"), "is not an HDF5 dataset name");
  if (slice.file().empty() || slice.file().size() > kMaxNameBytes ||
      slice.file().find('/') != std::string::npos || slice.file().find('\0') != std::string::npos ||
      slice.file() == "." || slice.file() == "..")
    return field_error(path, slice_field(index, "file"),
                       absl::StrCat("\"", slice.file(), "\" is not a plain file name"));
  const Shape shape = global_shape_of(slice);
  const std::string global_shape = slice_field(index, "global_shape");
  if (shape.size() > kMaxSliceRank)
    return field_error(path, global_shape, absl::StrCat("has more than ", kMaxSliceRank,
                                                        " dimensions"));
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }))
    return field_error(path, global_shape,
                       absl::StrCat(shape_string(shape), " has a negative dimension"));
  if (!checked_nbytes(shape, DType::kF32))
    return field_error(path, global_shape,
                       absl::StrCat(shape_string(shape), " has a byte size that overflows"));
  if (slice.tensor_parallel_dim() < -1 ||
      slice.tensor_parallel_dim() >= static_cast<int>(std::max<size_t>(shape.size(), 1)))
    return field_error(path, slice_field(index, "tensor_parallel_dim"),
                       absl::StrCat(slice.tensor_parallel_dim(), " is not -1 or a dimension of ",
                                    shape_string(shape)));
  const int64_t rows = rows_of(shape);
  if (slice.first_row() < 0 || slice.first_row() >= rows || slice.rows() < 1 ||
      slice.rows() > rows - slice.first_row())
    return field_error(path, slice_field(index, "rows"),
                       absl::StrCat("[", slice.first_row(), ", +", slice.rows(),
                                    ") are not rows inside dimension 0 of ", shape_string(shape)));
  if (!is_sha256_hex(slice.sha256()))
    return field_error(path, slice_field(index, "sha256"), "is not 64 lowercase hex digits");
  return absl::OkStatus();
}

// The slices of each tensor share its global shape and cover its dimension 0 exactly
// once: sorted by first row, each starts where the one before ended.
absl::Status check_tiling(const checkpoint::Manifest& manifest, const std::string& path) {
  std::map<std::string, std::vector<int>> slices_of;
  for (int i = 0; i < manifest.slices_size(); ++i)
    slices_of[manifest.slices(i).tensor()].push_back(i);
  for (auto& [tensor, indexes] : slices_of) {
    std::sort(indexes.begin(), indexes.end(), [&](int a, int b) {
      return manifest.slices(a).first_row() < manifest.slices(b).first_row();
    });
    const Shape shape = global_shape_of(manifest.slices(indexes.front()));
    int64_t next_row = 0;
    for (const int i : indexes) {
      const checkpoint::TensorSlice& s = manifest.slices(i);
      if (global_shape_of(s) != shape)
        return field_error(path, slice_field(i, "global_shape"),
                           absl::StrCat(shape_string(global_shape_of(s)), " differs from ",
                                        shape_string(shape), " in another slice of ", tensor));
      if (s.first_row() != next_row)
        return field_error(
            path, slice_field(i, "first_row"),
            absl::StrCat(s.first_row(), s.first_row() < next_row ? " overlaps" : " leaves a gap after",
                         " the slice of ", tensor, " ending at row ", next_row));
      next_row = s.first_row() + s.rows();
    }
    if (next_row != rows_of(shape))
      return absl::DataLossError(absl::StrCat(path, ": rows [", next_row, ", ", rows_of(shape),
                                              ") of ", tensor, " are in no slice"));
  }
  return absl::OkStatus();
}

// Every slice's file is a regular file inside checkpoint_dir holding at least the bytes
// of its slices, so nothing read from it is larger than the disk.
absl::Status check_slice_files(const std::string& checkpoint_dir,
                               const checkpoint::Manifest& manifest, const std::string& path) {
  std::map<std::string, std::pair<int64_t, int64_t>> files;  // name -> (size, bytes needed)
  for (int i = 0; i < manifest.slices_size(); ++i) {
    const checkpoint::TensorSlice& s = manifest.slices(i);
    auto it = files.find(s.file());
    if (it == files.end()) {
      SY_ASSIGN_OR_RETURN(const std::string file,
                          path_in_directory(checkpoint_dir, s.file(),
                                            absl::StrCat(path, ": field ", slice_field(i, "file"))));
      SY_ASSIGN_OR_RETURN(const int64_t size, regular_file_size(file));
      it = files.emplace(s.file(), std::make_pair(size, int64_t{0})).first;
    }
    auto& [size, needed] = it->second;
    if (slice_bytes(s) > size - needed)
      return absl::DataLossError(absl::StrCat(
          (fs::path(checkpoint_dir) / s.file()).string(), ": ", size,
          " bytes, too few for the slices the manifest places in it (truncated?)"));
    needed += slice_bytes(s);
  }
  return absl::OkStatus();
}

// Training time and a restarted learning-rate decay: finite, and the restart inside the
// run so far at a rate the recipe's schedule can reach.
absl::Status check_schedule_fields(const checkpoint::Manifest& manifest, const std::string& path) {
  if (!std::isfinite(manifest.elapsed_s()) || manifest.elapsed_s() < 0)
    return field_error(path, "elapsed_s",
                       absl::StrCat("is ", manifest.elapsed_s(), ", not a finite number >= 0"));
  if (!manifest.has_lr_restart()) return absl::OkStatus();
  const checkpoint::LrRestart& restart = manifest.lr_restart();
  if (restart.from_step() < 1 || restart.from_step() > manifest.step())
    return field_error(path, "lr_restart.from_step",
                       absl::StrCat("is ", restart.from_step(), ", outside [1, step]"));
  const config::OptimizerConfig& opt = manifest.recipe().optimizer();
  // The schedule's highest rate, with room for its rounding.
  const double highest = std::max<double>(opt.lr(), opt.min_lr()) * (1 + 1e-9);
  if (!(restart.from_lr() >= 0 && restart.from_lr() <= highest))
    return field_error(path, "lr_restart.from_lr",
                       absl::StrCat("is ", restart.from_lr(), ", outside [0, ", highest,
                                    "] (the recipe's optimizer.lr and min_lr)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<checkpoint::Manifest> parse_manifest(std::string_view bytes,
                                                    const std::string& path) {
  if (bytes.size() > static_cast<size_t>(kMaxMetadataFileBytes))
    return absl::DataLossError(absl::StrCat(path, ": is ", bytes.size(), " bytes, more than the ",
                                            kMaxMetadataFileBytes, " allowed"));
  checkpoint::Manifest manifest;
  // libprotobuf would print its own line for a string that is not UTF-8; the refusal
  // below is the one line.
  const google::protobuf::LogSilencer quiet;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return absl::DataLossError(absl::StrCat(path, ": not a valid manifest"));
  if (manifest.format_version() != kFormatVersion)
    return field_error(path, "format_version",
                       absl::StrCat("is ", manifest.format_version(), ", expected ", kFormatVersion,
                                    " (written by another version of the engine)"));
  // A checkpoint written before moe.score_function and moe.renormalize resumes as the
  // recipe that spells its routing anew, which is what resume compares it with.
  config::upgrade_legacy_routing(*manifest.mutable_recipe()->mutable_moe());
  const absl::Status recipe = config::validate_recipe(manifest.recipe());
  if (!recipe.ok())
    return absl::DataLossError(absl::StrCat(path, ": field recipe: ", recipe.message()));
  if (manifest.step() < 0 || manifest.step() > manifest.recipe().train().steps())
    return field_error(path, "step", absl::StrCat("is ", manifest.step(), ", outside [0, recipe.train.steps]"));
  if (manifest.loader().epoch() < 0 || manifest.loader().position() < 0)
    return field_error(path, "loader", "holds a negative epoch or position");
  SY_RETURN_IF_ERROR(check_schedule_fields(manifest, path));
  for (int i = 0; i < manifest.slices_size(); ++i)
    SY_RETURN_IF_ERROR(check_slice(manifest.slices(i), i, path));
  SY_RETURN_IF_ERROR(check_tiling(manifest, path));
  return manifest;
}

absl::StatusOr<checkpoint::Manifest> read_manifest(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / kManifestFile).string();
  absl::StatusOr<std::string> bytes = read_file(path);
  if (absl::IsNotFound(bytes.status()))
    return absl::NotFoundError(
        absl::StrCat(checkpoint_dir, ": no ", kManifestFile, " (not a checkpoint)"));
  SY_RETURN_IF_ERROR(bytes.status());
  SY_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, parse_manifest(*bytes, path));
  SY_RETURN_IF_ERROR(check_slice_files(checkpoint_dir, manifest, path));
  return manifest;
}

namespace {

// Slices read but not yet checksummed, at most (one slice more when a single slice is
// larger): bounds the memory a load holds beyond its destinations.
constexpr int64_t kChecksumWindowBytes = int64_t{256} << 20;

// The part of one slice that one read takes: rows [lo, hi) of the tensor.
struct Piece {
  size_t read;
  const checkpoint::TensorSlice* slice;
  int64_t lo, hi;
};

// The HDF5 dataset of `slice` holds fp32 values of shape [rows, global_shape[1:]...]
// (a scalar is saved as [1]).
absl::Status check_slice_dataset(const Hdf5Dataset& dataset, const checkpoint::TensorSlice& slice,
                                 const std::string& where) {
  const Shape expected = stored_shape_of(slice);
  const Shape dims(dataset.dims.begin(), dataset.dims.end());
  if (dims != expected)
    return absl::DataLossError(absl::StrCat(where, " has shape ", shape_string(dims),
                                            ", the manifest says ", shape_string(expected)));
  if (dataset.type.type_class != Hdf5Type::kFloat || dataset.type.size != 4)
    return absl::DataLossError(absl::StrCat(where, " does not hold 32-bit floats"));
  return absl::OkStatus();
}

// The rank files of one checkpoint, each opened (its superblock read and checked) once
// however many slices are read from it.
class RankFiles {
 public:
  explicit RankFiles(std::string checkpoint_dir) : dir_(std::move(checkpoint_dir)) {}
  absl::StatusOr<const Hdf5File*> get(const std::string& file) {
    auto it = open_.find(file);
    if (it == open_.end()) {
      SY_ASSIGN_OR_RETURN(Hdf5File h5, Hdf5File::open((fs::path(dir_) / file).string()));
      it = open_.emplace(file, std::move(h5)).first;
    }
    return &it->second;
  }

 private:
  std::string dir_;
  std::map<std::string, Hdf5File> open_;
};

// Reads `slice` whole from its file into `values`, its shape and type checked first.
absl::Status read_slice(RankFiles& files, const checkpoint::TensorSlice& slice,
                        std::vector<float>& values) {
  SY_ASSIGN_OR_RETURN(const Hdf5File* h5, files.get(slice.file()));
  const std::string where = absl::StrCat(h5->name(), ": dataset ", slice.dataset());
  SY_ASSIGN_OR_RETURN(const Hdf5Dataset dataset, h5->dataset(slice.dataset()));
  SY_RETURN_IF_ERROR(check_slice_dataset(dataset, slice, where));
  values.resize(static_cast<size_t>(dataset.num_bytes / 4));
  return h5->read(dataset, 0, dataset.num_bytes, values.data());
}

// A read's destination has the rows of the saved tensor: the same shape past dimension 0.
absl::Status check_row_shape(const std::string& checkpoint_dir, const RowsToRead& read,
                             const checkpoint::TensorSlice& slice) {
  const Shape saved = global_shape_of(slice);
  const Shape wanted = read.out.shape();
  const bool same = saved.size() < 2 && wanted.size() < 2
                        ? true
                        : saved.size() == wanted.size() &&
                              std::equal(saved.begin() + 1, saved.end(), wanted.begin() + 1);
  if (!same)
    return absl::DataLossError(absl::StrCat(checkpoint_dir, ": tensor ", read.key,
                                            " has shape ", shape_string(saved),
                                            " in the checkpoint, rows of ",
                                            shape_string(wanted), " were asked for"));
  return absl::OkStatus();
}

}  // namespace

absl::Status read_rows(const std::string& checkpoint_dir, const checkpoint::Manifest& manifest,
                       const std::vector<RowsToRead>& reads) {
  std::map<std::string, std::vector<const checkpoint::TensorSlice*>> slices_of;
  for (const checkpoint::TensorSlice& s : manifest.slices()) slices_of[s.tensor()].push_back(&s);
  // Every read's rows must be in the checkpoint before anything is read.
  std::vector<Piece> pieces;
  for (size_t r = 0; r < reads.size(); ++r) {
    const RowsToRead& read = reads[r];
    const int64_t rows = read.out.shape().empty() ? 1 : read.out.dim(0);
    int64_t covered = 0;
    for (const checkpoint::TensorSlice* s : slices_of[read.key]) {
      SY_RETURN_IF_ERROR(check_row_shape(checkpoint_dir, read, *s));
      const int64_t lo = std::max(read.first_row, s->first_row());
      const int64_t hi = std::min(read.first_row + rows, s->first_row() + s->rows());
      if (lo >= hi) continue;
      pieces.push_back({r, s, lo, hi});
      covered += hi - lo;
    }
    if (covered != rows)
      return absl::DataLossError(absl::StrCat(checkpoint_dir, ": rows [", read.first_row, ", ",
                                              read.first_row + rows, ") of ", read.key,
                                              " are not all in the checkpoint"));
  }
  // File reads and device copies stay on this (the master) thread; each slice's checksum
  // is a task, queued once its rows are in their destination, which the other CPU threads
  // take while they wait at the region's end.
  absl::Status status;
  std::vector<std::string> mismatches(pieces.size());
  int64_t waiting_bytes = 0;
  RankFiles files(checkpoint_dir);
#pragma omp parallel
#pragma omp master
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const RowsToRead& read = reads[piece.read];
    const int64_t row_elements = read.out.shape().empty() ? 1 : read.out.row_size();
    auto values = std::make_shared<std::vector<float>>();
    status = read_slice(files, *piece.slice, *values);
    if (!status.ok()) break;
    const size_t row_bytes = static_cast<size_t>(row_elements) * sizeof(float);
    read.out.device().copy_from_host(
        static_cast<char*>(read.out.raw_data()) + (piece.lo - read.first_row) * row_bytes,
        values->data() + (piece.lo - piece.slice->first_row()) * row_elements,
        (piece.hi - piece.lo) * row_bytes);
    waiting_bytes += static_cast<int64_t>(values->size() * sizeof(float));
#pragma omp task firstprivate(values, i)
    {
      const std::string digest = sha256_hex(std::string_view(
          reinterpret_cast<const char*>(values->data()), values->size() * sizeof(float)));
      if (digest != pieces[i].slice->sha256()) mismatches[i] = pieces[i].slice->file();
    }
    if (waiting_bytes >= kChecksumWindowBytes) {
#pragma omp taskwait
      waiting_bytes = 0;
    }
  }
  SY_RETURN_IF_ERROR(status);
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!mismatches[i].empty())
      return absl::DataLossError(absl::StrCat((fs::path(checkpoint_dir) / mismatches[i]).string(),
                                              ": checksum mismatch in ",
                                              pieces[i].slice->tensor()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> verify_checkpoint(const std::string& checkpoint_dir,
                                          const checkpoint::Manifest& manifest) {
  // Slices are read in batches of about kChecksumWindowBytes, so a verification holds
  // that much memory whatever the checkpoint's size.
  std::vector<RowsToRead> batch;
  int64_t batch_bytes = 0;
  for (int i = 0; i < manifest.slices_size(); ++i) {
    const checkpoint::TensorSlice& s = manifest.slices(i);
    batch.push_back({s.tensor(), s.first_row(), Tensor::empty(stored_shape_of(s))});
    batch_bytes += slice_bytes(s);
    if (batch_bytes >= kChecksumWindowBytes || i + 1 == manifest.slices_size()) {
      SY_RETURN_IF_ERROR(read_rows(checkpoint_dir, manifest, batch));
      batch.clear();
      batch_bytes = 0;
    }
  }
  return static_cast<int64_t>(manifest.slices_size());
}

}  // namespace switchyard
