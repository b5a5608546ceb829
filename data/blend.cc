#include "data/blend.h"

#include <algorithm>
#include <cmath>

#include "core/runtime/check.h"
#include "core/runtime/rng.h"

namespace switchyard {

namespace {

// Labels of the streams forked from the run's seed.
constexpr uint64_t kSourceOrderStream = 0xb1e0d5eedULL;
constexpr uint64_t kBlendOffsetStream = 0xb1e0d0ffULL;

}  // namespace

uint64_t source_seed(uint64_t seed, size_t source) {
  if (source == 0) return seed;
  return Rng(seed).fork(kSourceOrderStream).fork(source).next_u64();
}

BlendSchedule::BlendSchedule(const std::vector<double>& weights, uint64_t seed,
                             int64_t global_batch)
    : seed_(seed), global_batch_(global_batch) {
  SY_CHECK(!weights.empty() && global_batch > 0);
  double total = 0;
  for (double w : weights) total += w;
  double sum = 0;
  for (double w : weights) cumulative_.push_back((sum += w) / total);
  cumulative_.back() = 1.0;
}

std::vector<int64_t> BlendSchedule::bounds(int64_t step) const {
  const size_t n = cumulative_.size();
  std::vector<int64_t> b(n + 1, 0);
  b[n] = global_batch_;
  if (n == 1) return b;
  const double u = Rng(seed_).fork(kBlendOffsetStream).fork(static_cast<uint64_t>(step)).uniform();
  const double g = static_cast<double>(global_batch_);
  for (size_t i = 0; i + 1 < n; ++i) {
    const auto edge = static_cast<int64_t>(std::ceil(g * cumulative_[i] - u));
    b[i + 1] = std::clamp(edge, b[i], global_batch_);
  }
  return b;
}

std::vector<int64_t> BlendSchedule::drawn_before(int64_t steps) const {
  std::vector<int64_t> drawn(cumulative_.size(), 0);
  if (cumulative_.size() == 1) {
    drawn[0] = steps * global_batch_;
    return drawn;
  }
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int64_t> b = bounds(s);
    for (size_t i = 0; i < drawn.size(); ++i) drawn[i] += b[i + 1] - b[i];
  }
  return drawn;
}

}  // namespace switchyard
