// Counter-based random numbers: the stream is a pure function of (seed, counter), so
// its whole state is two integers that checkpoints can save and every backend can
// reproduce.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/runtime/host_device.h"

namespace switchyard {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t counter = 0) : seed_(seed), counter_(counter) {}

  uint64_t next_u64() { return u64_at(seed_, ++counter_); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return uniform_at(seed_, ++counter_); }
  // The numbers a stream of `seed` gives when its counter reaches `counter`: any draw of
  // the stream, computed apart (by one GPU thread per draw, say, with the CPU's bits).
  static SY_HOST_DEVICE uint64_t u64_at(uint64_t seed, uint64_t counter) {
    return mix(seed * 0x9E3779B97F4A7C15ULL + counter);
  }
  static SY_HOST_DEVICE double uniform_at(uint64_t seed, uint64_t counter) {
    return static_cast<double>(u64_at(seed, counter) >> 11) * 0x1.0p-53;
  }
  // Standard normal (Box-Muller, one value per two draws for simplicity).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return next_u64() % n; }

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  // An independent stream derived from this one's seed and a label.
  Rng fork(uint64_t label) const { return Rng(mix(seed_ ^ mix(label + 0x51ED27ULL))); }

 private:
  static SY_HOST_DEVICE uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t seed_;
  uint64_t counter_;
};

}  // namespace switchyard
