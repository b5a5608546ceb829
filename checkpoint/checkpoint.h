// Sharded checkpoints: <checkpoints>/step_<N>/ holds a manifest (manifest.proto) and
// one HDF5 file per rank that had something to write. Every tensor slice is written
// once, by the rank that owns it (dense parameters by world rank 0, expert shards by
// the first expert-data-parallel replica, ZeRO-sharded optimizer state by its owner),
// so any layout can load it by reading the rows it needs. A checkpoint is written to
// step_<N>.tmp/, fsynced, and renamed into place; `latest` then names it, replaced
// atomically; older checkpoints beyond `keep` are pruned, never the newest complete one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"
#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"

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
  double elapsed_s = 0;  // training seconds up to step, over every start of the run
  std::optional<checkpoint::LrRestart> lr_restart;  // a schedule changed on resume
};

// Collective over `world`: every rank calls it with its own slices. Returns the
// checkpoint directory.
absl::StatusOr<std::string> save_checkpoint(const std::string& checkpoints_dir,
                                            const CheckpointContents& contents,
                                            const std::vector<SliceToSave>& mine, int keep,
                                            Communicator& world);

// The steps of the step_<N> directories under checkpoints_dir, newest first.
std::vector<int64_t> checkpoint_steps(const std::string& checkpoints_dir);

// The checkpoint `latest` names ("" when there is no `latest`). `latest` must hold
// exactly "step_<N>\n" and name a directory inside checkpoints_dir (no symlink out of
// it) whose manifest is at step N.
absl::StatusOr<std::string> latest_checkpoint(const std::string& checkpoints_dir);

// The newest checkpoint under checkpoints_dir before step `before` whose manifest reads
// and whose every slice matches its checksum ("" when there is none).
std::string newest_complete_checkpoint(const std::string& checkpoints_dir, int64_t before);

// `problem`, a checkpoint that cannot be resumed, with the way on: the newest complete
// checkpoint before step `before` and the --resume-from that resumes from it.
absl::Status with_resume_hint(const absl::Status& problem, const std::string& checkpoints_dir,
                              int64_t before);

// The checkpoint a run whose checkpoints are in checkpoints_dir resumes from:
// `resume_from` when given (any checkpoint directory), else the one `latest` names; ""
// for a fresh start. Without `latest` (a kill before the first one was written) the
// newest step directory when it verifies whole. An unusable `latest`, or step
// directories without one whose newest does not verify, is refused with
// with_resume_hint, never taken for a fresh start.
absl::StatusOr<std::string> checkpoint_to_resume(const std::string& checkpoints_dir,
                                                 const std::string& resume_from);

// Reads and validates checkpoint_dir's manifest (parse_manifest), then checks that every
// slice's file is a regular file inside checkpoint_dir (no symlink out of it) large
// enough for the bytes of its slices.
absl::StatusOr<checkpoint::Manifest> read_manifest(const std::string& checkpoint_dir);

// The manifest in `bytes` (read from `path`, which errors name), refused unless it is
// of this format version, its recipe is valid, and every slice is sane: a plain file
// name, an HDF5 dataset name, a global shape of non-negative dimensions whose byte size
// fits int64, rows inside dimension 0, a SHA-256 of 64 hex digits; and the slices of
// each tensor agree on its global shape and tile its dimension 0 exactly.
absl::StatusOr<checkpoint::Manifest> parse_manifest(std::string_view bytes,
                                                    const std::string& path);

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
