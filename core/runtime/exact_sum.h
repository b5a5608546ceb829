// The exact sum of doubles, whatever their order: a fixed-point accumulator wide enough
// for every finite double (a long accumulator). Adding, merging two accumulators, or
// adding their limbs as integers (an all-reduce over ranks) in any order and grouping gives
// the same sum, so a figure summed over micro-batches and ranks (a loss, a gradient norm)
// has the same bits under every parallel layout. value() rounds the sum once, to the
// nearest double (ties to even), except that a sum below the smallest normal double may
// be rounded twice; it is deterministic either way.
#pragma once

#include <array>
#include <cstdint>

namespace switchyard {

// The most parts a gradient ledger's sum takes (kernels/cpu/exact_grad.h): under
// runtime.batch_invariant, the micro-batches of a step over all ranks.
inline constexpr int64_t kExactGradMaxParts = int64_t{1} << 14;

class ExactSum {
 public:
  // 32 value bits a limb from the smallest subnormal (2^-1074) past the largest finite
  // double, one limb of headroom, then three counts: NaNs, +infinities, -infinities.
  static constexpr int kValueLimbs = 67;
  static constexpr int kSize = kValueLimbs + 3;

  void add(double v);
  void add(const ExactSum& other);
  double value() const;

  // The limbs as integers, normalised so that adding up to 2^30 accumulators' limbs
  // element by element (an integer all-reduce) cannot overflow and gives their sum.
  int64_t* limbs() {
    normalize();
    return limbs_.data();
  }

 private:
  // Carries every value limb's excess into the next, leaving each in [0, 2^32) but the
  // last, which keeps the sign.
  void normalize();

  std::array<int64_t, kSize> limbs_{};
  int64_t pending_ = 0;  // additions since the last normalize()
};

}  // namespace switchyard
