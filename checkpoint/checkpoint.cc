#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/file_util.h"
#include "data/hdf5_handle.h"
#include "data/sha256.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;
constexpr char kManifestFile[] = "manifest.pb";
constexpr char kLatestFile[] = "latest";

std::string step_dir_name(int64_t step) { return absl::StrCat("step_", step); }

std::string slice_bytes_sha256(const Tensor& t) {
  return sha256_hex(std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes()));
}

// Writes this rank's slices into one HDF5 file and returns their manifest entries.
absl::StatusOr<std::vector<checkpoint::TensorSlice>> write_rank_file(
    const std::string& dir, const std::string& file, const std::vector<SliceToSave>& mine) {
  silence_hdf5_errors();
  const std::string path = (fs::path(dir) / file).string();
  H5Handle h5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!h5.valid()) return absl::DataLossError(absl::StrCat(path, ": cannot create"));
  H5Handle link_props(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(link_props.get(), 1);
  // Hashing is the slow part of a save (SHA-256 runs below disk speed on one core):
  // the slices are hashed in parallel first.
  std::vector<std::string> digests(mine.size());
  const int64_t count = static_cast<int64_t>(mine.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < count; ++i) digests[i] = slice_bytes_sha256(mine[i].value);
  std::vector<checkpoint::TensorSlice> entries;
  for (size_t i = 0; i < mine.size(); ++i) {
    const SliceToSave& s = mine[i];
    const Shape& shape = s.value.shape();
    const std::vector<hsize_t> dims = shape.empty() ? std::vector<hsize_t>{1}
                                                    : std::vector<hsize_t>(shape.begin(), shape.end());
    H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                   H5Sclose);
    H5Handle dataset(H5Dcreate2(h5.get(), s.key.c_str(), H5T_IEEE_F32LE, space.get(),
                                link_props.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
    if (!dataset.valid() || H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                                     H5P_DEFAULT, s.value.raw_data()) < 0)
      return absl::DataLossError(absl::StrCat(path, ": cannot write ", s.key));
    checkpoint::TensorSlice& e = entries.emplace_back();
    e.set_tensor(s.key);
    for (int64_t d : s.global_shape) e.add_global_shape(d);
    e.set_expert(s.expert);
    e.set_tensor_parallel_dim(s.tensor_parallel_dim);
    e.set_first_row(s.first_row);
    e.set_rows(s.value.shape().empty() ? 1 : s.value.dim(0));
    e.set_file(file);
    e.set_dataset(s.key);
    e.set_sha256(digests[i]);
  }
  if (!h5.reset()) return absl::DataLossError(absl::StrCat(path, ": closing failed (disk full?)"));
  SY_RETURN_IF_ERROR(fsync_path(path));
  return entries;
}

void prune(const std::string& checkpoints_dir, int64_t newest, int keep) {
  if (keep <= 0) return;
  std::vector<int64_t> steps;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos &&
        std::sscanf(name.c_str(), "step_%ld", &step) == 1 && step <= newest)
      steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
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
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fs::create_directories(tmp_dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(tmp_dir, ": cannot create: ", ec.message()));
  }
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
    for (int r = 0; r < world.size(); ++r) {
      const fs::path entries_path = fs::path(tmp_dir) / absl::StrCat("rank_", r, ".entries");
      std::ifstream in(entries_path, std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      checkpoint::Manifest rank_part;
      if (!rank_part.ParseFromString(bytes.str()))
        return absl::DataLossError(absl::StrCat(entries_path.string(), ": unreadable"));
      for (const auto& e : rank_part.slices()) *manifest.add_slices() = e;
      fs::remove(entries_path);
    }
    SY_RETURN_IF_ERROR(write_file_atomically((fs::path(tmp_dir) / kManifestFile).string(),
                                             manifest.SerializeAsString()));
    SY_RETURN_IF_ERROR(fsync_path(tmp_dir));
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) return absl::DataLossError(absl::StrCat(final_dir, ": cannot rename into place: ", ec.message()));
    SY_RETURN_IF_ERROR(fsync_path(checkpoints_dir));
    SY_RETURN_IF_ERROR(write_file_atomically((fs::path(checkpoints_dir) / kLatestFile).string(),
                                             step_dir_name(contents.step) + "\n"));
    prune(checkpoints_dir, contents.step, keep);
  }
  world.barrier();
  return final_dir;
}

absl::StatusOr<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  const fs::path latest = fs::path(checkpoints_dir) / kLatestFile;
  if (!fs::exists(latest)) return std::string();
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  const fs::path dir = fs::path(checkpoints_dir) / name;
  if (name.rfind("step_", 0) != 0 || !fs::exists(dir / kManifestFile))
    return absl::DataLossError(absl::StrCat(latest.string(), ": names \"", name,
                                            "\", which is not a complete checkpoint"));
  return dir.string();
}

absl::StatusOr<checkpoint::Manifest> read_manifest(const std::string& checkpoint_dir) {
  const fs::path path = fs::path(checkpoint_dir) / kManifestFile;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(checkpoint_dir, ": no ", kManifestFile, " (not a checkpoint)"));
  std::stringstream bytes;
  bytes << in.rdbuf();
  checkpoint::Manifest manifest;
  if (!manifest.ParseFromString(bytes.str()))
    return absl::DataLossError(absl::StrCat(path.string(), ": not a valid manifest"));
  if (manifest.format_version() != kFormatVersion)
    return absl::DataLossError(absl::StrCat(path.string(), ": format version ",
                                            manifest.format_version(), ", expected ",
                                            kFormatVersion));
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

// Reads `slice` whole from its file into `values` (row_elements per row).
absl::Status read_slice(const std::string& checkpoint_dir, const checkpoint::TensorSlice& slice,
                        int64_t row_elements, std::vector<float>& values) {
  const std::string path = (fs::path(checkpoint_dir) / slice.file()).string();
  H5Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!h5.valid())
    return absl::DataLossError(absl::StrCat(path, ": cannot open (missing or corrupt)"));
  H5Handle dataset(H5Dopen2(h5.get(), slice.dataset().c_str(), H5P_DEFAULT), H5Dclose);
  values.resize(static_cast<size_t>(slice.rows() * row_elements));
  if (!dataset.valid() ||
      H5Sget_simple_extent_npoints(H5Dget_space(dataset.get())) !=
          static_cast<hssize_t>(values.size()) ||
      H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    return absl::DataLossError(absl::StrCat(path, ": cannot read ", slice.tensor()));
  return absl::OkStatus();
}

}  // namespace

absl::Status read_rows(const std::string& checkpoint_dir, const checkpoint::Manifest& manifest,
                       const std::vector<RowsToRead>& reads) {
  silence_hdf5_errors();
  std::map<std::string, std::vector<const checkpoint::TensorSlice*>> slices_of;
  for (const checkpoint::TensorSlice& s : manifest.slices()) slices_of[s.tensor()].push_back(&s);
  // Every read's rows must be in the checkpoint before anything is read.
  std::vector<Piece> pieces;
  for (size_t r = 0; r < reads.size(); ++r) {
    const RowsToRead& read = reads[r];
    const int64_t rows = read.out.shape().empty() ? 1 : read.out.dim(0);
    int64_t covered = 0;
    for (const checkpoint::TensorSlice* s : slices_of[read.key]) {
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
  // HDF5 reads and device copies stay on this (the master) thread; each slice's checksum
  // is a task, queued once its rows are in their destination, which the other CPU threads
  // take while they wait at the region's end.
  absl::Status status;
  std::vector<std::string> mismatches(pieces.size());
  int64_t waiting_bytes = 0;
#pragma omp parallel
#pragma omp master
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const RowsToRead& read = reads[piece.read];
    const int64_t row_elements = read.out.shape().empty() ? 1 : read.out.row_size();
    auto values = std::make_shared<std::vector<float>>();
    status = read_slice(checkpoint_dir, *piece.slice, row_elements, *values);
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
  std::vector<RowsToRead> reads;
  for (const checkpoint::TensorSlice& s : manifest.slices()) {
    Shape shape(s.global_shape().begin(), s.global_shape().end());
    if (shape.empty()) shape.push_back(1);
    shape[0] = s.rows();
    reads.push_back({s.tensor(), s.first_row(), Tensor::empty(shape)});
  }
  SY_RETURN_IF_ERROR(read_rows(checkpoint_dir, manifest, reads));
  return static_cast<int64_t>(reads.size());
}

}  // namespace switchyard
