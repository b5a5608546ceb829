// Checkpoint save and load throughput against plain sequential I/O of the same bytes on
// the same disk, in one run.
//
//   checkpoint_io DIR [MEGABYTES]   (default 256 MB)
//
// Builds tensors of MEGABYTES in all (16 tensors of 4096 columns), then, best of 3 each:
//  - save: save_checkpoint() into DIR (HDF5 file, sha256 of every slice, manifest,
//    fsync of files and directories, atomic rename);
//  - load: one read_rows() of every tensor (HDF5 reads, checksums verified in parallel);
//  - plain write: the same bytes written to one file with write() then fsync();
//  - plain read: that file read back with read().
// Reads come from the page cache in both cases (the files were just written; dropping
// caches needs privileges the benchmark does not assume). Prints one JSON line with
// GB/s for each and the ratios checkpoint / plain.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/comm/local_communicator.h"
#include "core/runtime/rng.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

constexpr int kTensors = 16;
constexpr int64_t kColumns = 4096;
constexpr int kRuns = 3;

// Best seconds of kRuns calls of `run`.
double best_seconds(const std::function<void()>& run) {
  double best = 1e30;
  for (int i = 0; i < kRuns; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count());
  }
  return best;
}

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "checkpoint_io: %s\n", what.c_str());
  std::exit(1);
}

void check(const absl::Status& status) { check(status.ok(), std::string(status.message())); }

int run(const std::string& dir, int64_t megabytes) {
  const int64_t rows = std::max<int64_t>(1, megabytes * 1048576 / (kTensors * kColumns * 4));
  std::vector<SliceToSave> slices;
  Rng rng(1);
  for (int t = 0; t < kTensors; ++t) {
    Tensor value = Tensor::empty({rows, kColumns});
    float* v = value.data<float>();
    for (int64_t i = 0; i < value.numel(); ++i) v[i] = static_cast<float>(rng.uniform());
    slices.push_back(SliceToSave{"param/tensor_" + std::to_string(t), value, {rows, kColumns}});
  }
  const double bytes = static_cast<double>(kTensors) * rows * kColumns * 4;
  fs::create_directories(dir);
  LocalCommunicator world;
  CheckpointContents contents;
  std::string saved;
  int64_t step = 0;
  const double save_s = best_seconds([&] {
    contents.step = ++step;
    absl::StatusOr<std::string> result =
        save_checkpoint(dir + "/checkpoints", contents, slices, /*keep=*/1, world);
    check(result.status());
    saved = *result;
  });
  absl::StatusOr<checkpoint::Manifest> manifest = read_manifest(saved);
  check(manifest.status());
  std::vector<RowsToRead> loads;
  for (int t = 0; t < kTensors; ++t)
    loads.push_back({slices[t].key, 0, Tensor::empty({rows, kColumns})});
  const double load_s = best_seconds([&] { check(read_rows(saved, *manifest, loads)); });

  const std::string plain = dir + "/plain.bin";
  const double write_s = best_seconds([&] {
    const int fd = ::open(plain.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    check(fd >= 0, plain + ": cannot create");
    for (const SliceToSave& s : slices)
      check(::write(fd, s.value.raw_data(), s.value.nbytes()) ==
                static_cast<ssize_t>(s.value.nbytes()),
            plain + ": write failed");
    check(::fsync(fd) == 0 && ::close(fd) == 0, plain + ": fsync failed");
  });
  const double read_s = best_seconds([&] {
    const int fd = ::open(plain.c_str(), O_RDONLY);
    check(fd >= 0, plain + ": cannot open");
    for (RowsToRead& load : loads)
      check(::read(fd, load.out.raw_data(), load.out.nbytes()) ==
                static_cast<ssize_t>(load.out.nbytes()),
            plain + ": read failed");
    ::close(fd);
  });
  fs::remove_all(dir + "/checkpoints");
  fs::remove(plain);

  const double gb = bytes / 1e9;
  std::printf(
      "{\"megabytes\": %.0f, \"save_gbps\": %.3f, \"plain_write_gbps\": %.3f, "
      "\"save_vs_plain\": %.3f, \"load_gbps\": %.3f, \"plain_read_gbps\": %.3f, "
      "\"load_vs_plain\": %.3f}\n",
      bytes / 1048576, gb / save_s, gb / write_s, write_s / save_s, gb / load_s, gb / read_s,
      read_s / load_s);
  return 0;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: checkpoint_io DIR [MEGABYTES]\n");
    return 2;
  }
  const int64_t megabytes = argc == 3 ? std::atoll(argv[2]) : 256;
  if (megabytes < 1) {
    std::fprintf(stderr, "checkpoint_io: MEGABYTES must be a positive number\n");
    return 2;
  }
  return switchyard::run(argv[1], megabytes);
}
