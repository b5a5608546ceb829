// Training batches from one TokenDataset or a weighted blend of several: packed windows
// (see TokenDataset::read_window) in a seeded order, split over data-parallel ranks, read
// ahead on a background thread.
//
// Global-batch semantics, so that every parallel layout trains on the same tokens:
//   - Epoch e visits all W windows of the split in the order of a permutation drawn from
//     (seed, e); epochs follow one another without a gap.
//   - Optimizer step s consumes the next G = global_batch windows of that endless
//     sequence (a step may straddle two epochs).
//   - Data-parallel rank r of D takes the contiguous slice [r*G/D, (r+1)*G/D) of each
//     step's windows, and next_batch() hands them out in order, micro-batch by
//     micro-batch; after the slice of step s comes the slice of step s+1.
// A blend (data/blend.h) splits each step's G windows among its sources by weight; each
// source walks its own endless sequence of epochs (seeded by source_seed), and the step's
// windows are source 0's next ones, then source 1's, and so on.
// The batches are a pure function of (sources, weights, seq_len, seed, G, D, r):
// read-ahead, timing and restarts change nothing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/blend.h"
#include "data/token_dataset.h"

namespace switchyard {

// Where a loader stands; checkpoints save it. (epoch, position) is the first window of
// the current step in epoch order, which does not depend on the parallel layout;
// `consumed` counts the windows of this rank's slice of that step already returned (0
// at step boundaries, where checkpoints are taken, so any layout can resume). A blend's
// epoch is nominal: the sum of its sources' windows.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t consumed = 0;
  bool operator==(const LoaderState&) const = default;
};

struct LoaderOptions {
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t global_batch = 0;  // windows per optimizer step, over all ranks
  int dp_rank = 0;
  int dp_size = 1;
  int64_t prefetch_steps = 2;  // rank slices read ahead
  // Also hand out each window's document starts (TokenDataset::window_document_starts;
  // every source must be opened with_documents), for document-aware attention.
  bool document_starts = false;
};

// The order in which epoch `epoch` visits windows 0..windows-1 (a seeded Fisher-Yates
// shuffle). 8 bytes per window.
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t windows);

// One source of a blend: a split of a dataset and its weight (positive, finite).
struct LoaderSource {
  TokenDataset dataset;
  double weight = 1;
};

class Loader {
 public:
  static absl::StatusOr<std::unique_ptr<Loader>> create(const TokenDataset& dataset,
                                                        const LoaderOptions& options);
  static absl::StatusOr<std::unique_ptr<Loader>> create(std::vector<LoaderSource> sources,
                                                        const LoaderOptions& options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Fills ids and targets (micro_batch x seq_len each, row-major) with this rank's next
  // micro_batch windows, and doc_starts (the same shape) with their document starts when
  // the loader was made with document_starts (else it must be null), and tokens (when
  // given: micro_batch entries) with each window's TokenDataset::window_tokens. Errors (a
  // shard that turned unreadable, an id at or above the vocabulary size) name the shard
  // and position.
  absl::Status next_batch(int64_t micro_batch, int32_t* ids, int32_t* targets,
                          int32_t* doc_starts = nullptr, int32_t* tokens = nullptr);

  LoaderState state() const;
  // Continues exactly where `state` was taken. A state in the middle of a step
  // (consumed > 0) must come from the same global batch and layout; so must any state
  // of a blend.
  absl::Status restore(const LoaderState& state);

  int64_t windows_per_epoch() const { return windows_; }
  int64_t local_batch() const { return local_batch_; }
  // Windows drawn from each source, over all ranks, by the steps whose slices this rank
  // has handed out completely.
  const std::vector<int64_t>& windows_drawn() const { return drawn_; }

 private:
  Loader(std::vector<LoaderSource> sources, const LoaderOptions& options);

  // One rank slice of one step, read by the background thread.
  struct Block {
    int64_t step_start = 0;  // global index of the step's first window
    std::vector<int32_t> ids;
    std::vector<int32_t> targets;
    std::vector<int32_t> doc_starts;  // with options_.document_starts
    std::vector<int32_t> tokens;      // each window's window_tokens
    absl::Status status;
  };

  // Windows drawn from each source before the step starting at global window
  // `step_start`.
  std::vector<int64_t> drawn_at(int64_t step_start) const;
  // Each source's windows in the step starting at global window `step_start`.
  std::vector<int64_t> step_counts(int64_t step_start) const;
  void start_reader(int64_t step_start);
  void stop_reader();
  void read_ahead(int64_t step_start);
  // Fills `block` given the windows each source had given before its step.
  absl::Status fill_block(Block& block, const std::vector<int64_t>& drawn);
  const std::vector<int64_t>& permutation(size_t source, int64_t epoch);

  const std::vector<LoaderSource> sources_;
  const LoaderOptions options_;
  const BlendSchedule schedule_;
  std::vector<int64_t> source_windows_;  // each source's windows per epoch
  int64_t windows_ = 0;                  // their sum
  const int64_t local_batch_;

  // Consumer position: the step being handed out and how far into this rank's slice.
  int64_t step_start_ = 0;
  int64_t consumed_ = 0;
  std::vector<int64_t> drawn_;  // per source, by the steps before step_start_

  // Shared with the reader thread.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Block> ready_;
  bool stopping_ = false;
  std::thread reader_;

  // Reader thread only: per source, the permutations of the last two epochs it touched.
  struct PermutationCache {
    int64_t epochs[2] = {-1, -1};
    std::vector<int64_t> orders[2];
  };
  std::vector<PermutationCache> cached_permutations_;
};

}  // namespace switchyard
