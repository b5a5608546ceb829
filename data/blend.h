// A weighted blend of token sources: which source each window of a global batch comes
// from. The draw is systematic sampling with one uniform offset per optimizer step, drawn
// from (seed, step): source i takes ceil(G * C_i - u) - ceil(G * C_{i-1} - u) of the G
// windows of a step, C being the cumulative normalised weights, so each source gets
// floor or ceil of G * w_i windows per step and exactly G * w_i in expectation. The
// boundaries depend on (weights, seed, step, G) only, never on the parallel layout, and
// need no state: a resumed run recomputes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace switchyard {

// The seed of source `source`'s own window order (epoch permutations): the run's seed
// for source 0, so that a blend of one source is the plain dataset, and a stream
// derived from it for the others.
uint64_t source_seed(uint64_t seed, size_t source);

class BlendSchedule {
 public:
  // weights: positive and finite, one per source (the caller checks); normalised here.
  BlendSchedule(const std::vector<double>& weights, uint64_t seed, int64_t global_batch);

  size_t sources() const { return cumulative_.size(); }
  // sources() + 1 slot boundaries of step `step` (0-based): source i takes the step's
  // windows [bounds[i], bounds[i + 1]) in global-batch order.
  std::vector<int64_t> bounds(int64_t step) const;
  // Windows drawn from each source by steps [0, steps).
  std::vector<int64_t> drawn_before(int64_t steps) const;

 private:
  std::vector<double> cumulative_;  // normalised; the last is exactly 1
  uint64_t seed_;
  int64_t global_batch_;
};

}  // namespace switchyard
