// Exact sums of f32 gradient parts in fixed point (kernels/exact_grad.h).
//
// An element is the integer X = hi * 2^48 + lo in units of 2^-64, stored as the pair
// (hi, lo) with lo in [0, 2^48) after each addition. A part v is first rounded to the
// nearest multiple of 2^-64 (ties to even: exact for |v| >= 2^-41), and must be below
// 2^32 in magnitude; adding such parts is integer addition, so any order and any split
// over ranks gives the same X. Pairs added as two integers (an all-reduce) stay exact:
// at most kExactGradMaxParts (2^14) parts of a sum keep |hi| and lo below 2^62.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/runtime/exact_sum.h"
#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

static_assert(kExactGradMaxParts <= int64_t{1} << 14, "a ledger's limbs hold 2^14 parts");

// 2^48: the weight of hi, one past the largest lo.
inline constexpr int64_t kExactGradLow = int64_t{1} << 48;

// The two counts after the pairs: parts that were NaN, and parts that were infinite or
// beyond the range.
struct ExactGradFaults {
  int64_t nan = 0, out_of_range = 0;
};

// The part v in units of 2^-64; false when it is NaN, infinite or |v| >= 2^32.
inline bool exact_grad_units(float v, __int128& units, ExactGradFaults& faults) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const int biased = static_cast<int>((bits >> 23) & 0xff);
  if (biased == 0xff && (bits & 0x7fffff) != 0) {
    ++faults.nan;
    return false;
  }
  if (biased >= 127 + 32) {
    ++faults.out_of_range;
    return false;
  }
  int64_t mantissa = bits & 0x7fffff;
  if (biased != 0) mantissa |= int64_t{1} << 23;
  // v = mantissa * 2^(biased - 150) (a subnormal: 2^-149) = mantissa * 2^shift units.
  const int shift = (biased == 0 ? 1 : biased) - 150 + 64;
  __int128 magnitude;
  if (shift >= 0) {
    magnitude = static_cast<__int128>(mantissa) << shift;
  } else if (-shift > 24) {
    magnitude = 0;  // below half a unit
  } else {
    const int drop = -shift;
    const int64_t kept = mantissa >> drop;
    const int64_t rest = mantissa & ((int64_t{1} << drop) - 1);
    const int64_t half = int64_t{1} << (drop - 1);
    magnitude = kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
  }
  units = (bits >> 31) ? -magnitude : magnitude;
  return true;
}

// pairs[2i], pairs[2i+1] (hi, lo) += part[i]; faults counted for the parts left out.
inline void exact_grad_add(const float* part, int64_t* pairs, int64_t n, ExactGradFaults& faults) {
  int64_t nan = 0, out_of_range = 0;
#pragma omp parallel for schedule(static) reduction(+ : nan, out_of_range) \
    if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    ExactGradFaults local;
    __int128 units;
    if (!exact_grad_units(part[i], units, local)) {
      nan += local.nan;
      out_of_range += local.out_of_range;
      continue;
    }
    if (units == 0) continue;
    const __int128 x =
        static_cast<__int128>(pairs[2 * i]) * kExactGradLow + pairs[2 * i + 1] + units;
    pairs[2 * i] = static_cast<int64_t>(x >> 48);
    pairs[2 * i + 1] = static_cast<int64_t>(x & (kExactGradLow - 1));
  }
  faults.nan += nan;
  faults.out_of_range += out_of_range;
}

// out[i] = the sum of pair i rounded once to f32 (ties to even); NaN where any part was
// NaN, +infinity where any was infinite or out of range.
inline void exact_grad_read(const int64_t* pairs, const ExactGradFaults& faults, float* out,
                            int64_t n) {
  const bool nan = faults.nan > 0;
  const bool overflow = faults.out_of_range > 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    if (nan || overflow) {
      out[i] = nan ? NAN : INFINITY;
      continue;
    }
    const __int128 x = static_cast<__int128>(pairs[2 * i]) * kExactGradLow + pairs[2 * i + 1];
    // One rounding to f32, then an exact scaling by a power of two.
    out[i] = std::ldexp(static_cast<float>(x), -64);
  }
}

}  // namespace switchyard::cpu
