#include "data/loader.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/runtime/check.h"
#include "engine/runtime/rng.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t windows) {
  std::vector<int64_t> order(static_cast<size_t>(windows));
  std::iota(order.begin(), order.end(), 0);
  Rng rng = Rng(seed).fork(static_cast<uint64_t>(epoch));
  for (int64_t i = windows - 1; i > 0; --i)
    std::swap(order[i], order[rng.below(static_cast<uint64_t>(i) + 1)]);
  return order;
}

absl::StatusOr<std::unique_ptr<Loader>> Loader::create(const TokenDataset& dataset,
                                                       const LoaderOptions& options) {
  if (options.seq_len < 1) return absl::InvalidArgumentError("the loader needs seq_len >= 1");
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size)
    return absl::InvalidArgumentError(absl::StrCat("data-parallel rank ", options.dp_rank,
                                                   " is not in [0, ", options.dp_size, ")"));
  if (options.global_batch < 1 || options.global_batch % options.dp_size != 0)
    return absl::InvalidArgumentError(absl::StrCat("global batch ", options.global_batch,
                                                   " is not a positive multiple of the ",
                                                   options.dp_size, " data-parallel ranks"));
  if (options.prefetch_steps < 1)
    return absl::InvalidArgumentError("the loader needs prefetch_steps >= 1");
  if (dataset.num_windows(options.seq_len) < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.dir(), ": the ", dataset.split(), " split has ", dataset.num_tokens(),
                     " tokens, fewer than one window of seq_len + 1 = ", options.seq_len + 1));
  std::unique_ptr<Loader> loader(new Loader(dataset, options));
  loader->start_reader(0);
  return loader;
}

Loader::Loader(const TokenDataset& dataset, const LoaderOptions& options)
    : dataset_(dataset),
      options_(options),
      windows_(dataset.num_windows(options.seq_len)),
      local_batch_(options.global_batch / options.dp_size) {}

Loader::~Loader() { stop_reader(); }

void Loader::start_reader(int64_t step_start) {
  SY_CHECK(!reader_.joinable());
  reader_ = std::thread([this, step_start] { read_ahead(step_start); });
}

void Loader::stop_reader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (reader_.joinable()) reader_.join();
  ready_.clear();
  stopping_ = false;
}

const std::vector<int64_t>& Loader::permutation(int64_t epoch) {
  for (int i = 0; i < 2; ++i)
    if (cached_epochs_[i] == epoch) return cached_permutations_[i];
  // Replace the older epoch: steps only move forward.
  const int slot = cached_epochs_[0] < cached_epochs_[1] ? 0 : 1;
  cached_epochs_[slot] = epoch;
  cached_permutations_[slot] = epoch_permutation(options_.seed, epoch, windows_);
  return cached_permutations_[slot];
}

absl::Status Loader::fill_block(Block& block) {
  const int64_t seq = options_.seq_len;
  block.ids.resize(static_cast<size_t>(local_batch_ * seq));
  block.targets.resize(block.ids.size());
  const int64_t first = block.step_start + options_.dp_rank * local_batch_;
  for (int64_t i = 0; i < local_batch_; ++i) {
    const int64_t global = first + i;
    const int64_t window = permutation(global / windows_)[global % windows_];
    SY_RETURN_IF_ERROR(dataset_.read_window(window, seq, block.ids.data() + i * seq,
                                            block.targets.data() + i * seq));
  }
  return absl::OkStatus();
}

void Loader::read_ahead(int64_t step_start) {
  for (int64_t start = step_start;; start += options_.global_batch) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] {
        return stopping_ || static_cast<int64_t>(ready_.size()) < options_.prefetch_steps;
      });
      if (stopping_) return;
    }
    Block block;
    block.step_start = start;
    block.status = fill_block(block);
    const bool failed = !block.status.ok();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(block));
    }
    changed_.notify_all();
    // A failed block stays at the front of the queue and is reported on every call.
    if (failed) return;
  }
}

absl::Status Loader::next_batch(int64_t micro_batch, int32_t* ids, int32_t* targets) {
  const int64_t seq = options_.seq_len;
  while (micro_batch > 0) {
    Block* block;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return !ready_.empty(); });
      block = &ready_.front();
    }
    // The reader only appends, which leaves the front block in place.
    SY_RETURN_IF_ERROR(block->status);
    SY_CHECK(block->step_start == step_start_);
    const int64_t take = std::min(micro_batch, local_batch_ - consumed_);
    std::copy_n(block->ids.begin() + consumed_ * seq, take * seq, ids);
    std::copy_n(block->targets.begin() + consumed_ * seq, take * seq, targets);
    ids += take * seq;
    targets += take * seq;
    micro_batch -= take;
    consumed_ += take;
    if (consumed_ == local_batch_) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.pop_front();
      }
      changed_.notify_all();
      step_start_ += options_.global_batch;
      consumed_ = 0;
    }
  }
  return absl::OkStatus();
}

LoaderState Loader::state() const {
  return {step_start_ / windows_, step_start_ % windows_, consumed_};
}

absl::Status Loader::restore(const LoaderState& state) {
  if (state.epoch < 0 || state.position < 0 || state.position >= windows_ || state.consumed < 0 ||
      state.consumed >= local_batch_)
    return absl::InvalidArgumentError(
        absl::StrCat("loader state (epoch ", state.epoch, ", position ", state.position,
                     ", consumed ", state.consumed, ") does not fit this dataset (", windows_,
                     " windows per epoch) and local batch (", local_batch_, ")"));
  stop_reader();
  step_start_ = state.epoch * windows_ + state.position;
  consumed_ = state.consumed;
  start_reader(step_start_);
  return absl::OkStatus();
}

}  // namespace switchyard
