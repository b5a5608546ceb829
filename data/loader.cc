#include "data/loader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/runtime/check.h"
#include "core/runtime/rng.h"
#include "core/runtime/status_macros.h"

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
  return create(std::vector<LoaderSource>{{dataset, 1.0}}, options);
}

absl::StatusOr<std::unique_ptr<Loader>> Loader::create(std::vector<LoaderSource> sources,
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
  if (sources.empty()) return absl::InvalidArgumentError("the loader needs a data source");
  for (const LoaderSource& source : sources) {
    const TokenDataset& dataset = source.dataset;
    if (!(source.weight > 0) || !std::isfinite(source.weight))
      return absl::InvalidArgumentError(absl::StrCat(
          dataset.dir(), ": a blend weight must be positive and finite, not ", source.weight));
    if (options.document_starts && !dataset.has_documents())
      return absl::InvalidArgumentError(
          absl::StrCat(dataset.dir(), ": opened without its documents, which the loader needs"));
    if (dataset.num_windows(options.seq_len) < 1)
      return absl::InvalidArgumentError(absl::StrCat(
          dataset.dir(), ": the ", dataset.split(), " split has ", dataset.num_tokens(),
          " tokens, fewer than one window of seq_len + 1 = ", options.seq_len + 1));
  }
  std::unique_ptr<Loader> loader(new Loader(std::move(sources), options));
  loader->start_reader(0);
  return loader;
}

namespace {

std::vector<double> weights_of(const std::vector<LoaderSource>& sources) {
  std::vector<double> weights;
  for (const LoaderSource& source : sources) weights.push_back(source.weight);
  return weights;
}

}  // namespace

Loader::Loader(std::vector<LoaderSource> sources, const LoaderOptions& options)
    : sources_(std::move(sources)),
      options_(options),
      schedule_(weights_of(sources_), options.seed, options.global_batch),
      local_batch_(options.global_batch / options.dp_size),
      drawn_(sources_.size(), 0),
      cached_permutations_(sources_.size()) {
  for (const LoaderSource& source : sources_) {
    source_windows_.push_back(source.dataset.num_windows(options.seq_len));
    windows_ += source_windows_.back();
  }
}

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

std::vector<int64_t> Loader::drawn_at(int64_t step_start) const {
  if (sources_.size() == 1) return {step_start};
  return schedule_.drawn_before(step_start / options_.global_batch);
}

std::vector<int64_t> Loader::step_counts(int64_t step_start) const {
  const std::vector<int64_t> bounds = schedule_.bounds(step_start / options_.global_batch);
  std::vector<int64_t> counts(sources_.size());
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = bounds[i + 1] - bounds[i];
  return counts;
}

const std::vector<int64_t>& Loader::permutation(size_t source, int64_t epoch) {
  PermutationCache& cache = cached_permutations_[source];
  for (int i = 0; i < 2; ++i)
    if (cache.epochs[i] == epoch) return cache.orders[i];
  // Replace the older epoch: steps only move forward.
  const int slot = cache.epochs[0] < cache.epochs[1] ? 0 : 1;
  cache.epochs[slot] = epoch;
  cache.orders[slot] =
      epoch_permutation(source_seed(options_.seed, source), epoch, source_windows_[source]);
  return cache.orders[slot];
}

absl::Status Loader::fill_block(Block& block, const std::vector<int64_t>& drawn) {
  const int64_t seq = options_.seq_len;
  block.ids.resize(static_cast<size_t>(local_batch_ * seq));
  block.targets.resize(block.ids.size());
  if (options_.document_starts) block.doc_starts.resize(block.ids.size());
  block.tokens.resize(static_cast<size_t>(local_batch_));
  const std::vector<int64_t> bounds = schedule_.bounds(block.step_start / options_.global_batch);
  const int64_t first = options_.dp_rank * local_batch_;
  size_t source = 0;
  for (int64_t i = 0; i < local_batch_; ++i) {
    const int64_t slot = first + i;
    while (slot >= bounds[source + 1]) ++source;
    const int64_t windows = source_windows_[source];
    const int64_t drawn_here = drawn[source] + slot - bounds[source];
    const int64_t window = permutation(source, drawn_here / windows)[drawn_here % windows];
    const TokenDataset& dataset = sources_[source].dataset;
    SY_RETURN_IF_ERROR(
        dataset.read_window(window, seq, block.ids.data() + i * seq, block.targets.data() + i * seq));
    if (options_.document_starts)
      dataset.window_document_starts(window, seq, block.doc_starts.data() + i * seq);
    block.tokens[static_cast<size_t>(i)] = static_cast<int32_t>(dataset.window_tokens(window, seq));
  }
  return absl::OkStatus();
}

void Loader::read_ahead(int64_t step_start) {
  std::vector<int64_t> drawn = drawn_at(step_start);
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
    block.status = fill_block(block, drawn);
    const std::vector<int64_t> counts = step_counts(start);
    for (size_t i = 0; i < drawn.size(); ++i) drawn[i] += counts[i];
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

absl::Status Loader::next_batch(int64_t micro_batch, int32_t* ids, int32_t* targets,
                                int32_t* doc_starts, int32_t* tokens) {
  SY_CHECK_MSG((doc_starts != nullptr) == options_.document_starts,
               "next_batch: doc_starts must be given exactly when the loader hands them out");
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
    if (doc_starts) {
      std::copy_n(block->doc_starts.begin() + consumed_ * seq, take * seq, doc_starts);
      doc_starts += take * seq;
    }
    if (tokens) {
      std::copy_n(block->tokens.begin() + consumed_, take, tokens);
      tokens += take;
    }
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
      const std::vector<int64_t> counts = step_counts(step_start_);
      for (size_t i = 0; i < drawn_.size(); ++i) drawn_[i] += counts[i];
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
      state.consumed >= local_batch_ ||
      state.epoch > (std::numeric_limits<int64_t>::max() - state.position) / windows_)
    return absl::InvalidArgumentError(
        absl::StrCat("loader state (epoch ", state.epoch, ", position ", state.position,
                     ", consumed ", state.consumed, ") does not fit this dataset (", windows_,
                     " windows per epoch) and local batch (", local_batch_, ")"));
  const int64_t step_start = state.epoch * windows_ + state.position;
  if (sources_.size() > 1 && step_start % options_.global_batch != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "loader state (epoch ", state.epoch, ", position ", state.position,
        ") is not at a step boundary of this blend's global batch (", options_.global_batch,
        ")"));
  stop_reader();
  step_start_ = step_start;
  consumed_ = state.consumed;
  drawn_ = drawn_at(step_start_);
  start_reader(step_start_);
  return absl::OkStatus();
}

}  // namespace switchyard
