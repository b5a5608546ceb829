// Sharded checkpoints: <checkpoints>/step_<N>/ holds a manifest (manifest.proto) and
// one HDF5 file per rank that had something to write. Every tensor slice is written
// once, by the rank that owns it (dense parameters by world rank 0, expert shards by
// the first expert-data-parallel replica, ZeRO-sharded optimizer state by its owner),
// so any layout can load it by reading the rows it needs. A checkpoint is written to
// step_<N>.tmp/, fsynced, and renamed into place; `latest` then names it, replaced
// atomically; older checkpoints beyond `keep` are pruned, never the newest complete one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"
#include "engine/parallel/communicator.h"
#include "engine/runtime/tensor.h"

namespace switchyard {

// One slice this rank writes: rows [first_row, first_row + value.dim(0)) of tensor
// `key` (e.g. "param/model.norm.weight"), whose whole shape is global_shape.
struct SliceToSave {
  std::string key;
  Tensor value;
  Shape global_shape;
  bool expert = false;
  int tensor_parallel_dim = -1;
  int64_t first_row = 0;
};

struct CheckpointContents {
  config::Recipe recipe;
  checkpoint::SavedLayout layout;
  int64_t step = 0;
  checkpoint::LoaderPosition loader;
};

// Collective over `world`: every rank calls it with its own slices. Returns the
// checkpoint directory.
absl::StatusOr<std::string> save_checkpoint(const std::string& checkpoints_dir,
                                            const CheckpointContents& contents,
                                            const std::vector<SliceToSave>& mine, int keep,
                                            Communicator& world);

// The newest complete checkpoint under checkpoints_dir ("" when there is none).
absl::StatusOr<std::string> latest_checkpoint(const std::string& checkpoints_dir);

absl::StatusOr<checkpoint::Manifest> read_manifest(const std::string& checkpoint_dir);

// One read from a checkpoint: rows [first_row, first_row + out.dim(0)) of tensor `key`
// (e.g. "param/model.norm.weight") into `out`, on any device.
struct RowsToRead {
  std::string key;
  int64_t first_row = 0;
  Tensor out;
};

// Fills each read's `out` from the slices that hold its rows and verifies every slice
// read against its checksum; any failure is a DataLossError naming the file (and then
// the contents of the `out`s are unspecified). The HDF5 reads run one after another on
// the calling thread, while the CPU threads (kernels/threads.h) checksum the slices
// already read, so a load hashes at the speed of all of them.
absl::Status read_rows(const std::string& checkpoint_dir, const checkpoint::Manifest& manifest,
                       const std::vector<RowsToRead>& reads);

// Reads every slice of the checkpoint and verifies its checksum; returns how many.
absl::StatusOr<int64_t> verify_checkpoint(const std::string& checkpoint_dir,
                                          const checkpoint::Manifest& manifest);

}  // namespace switchyard
