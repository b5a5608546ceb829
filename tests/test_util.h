// Helpers shared by the unit tests: seeded random inputs and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/runtime/rng.h"

namespace switchyard::testing {

// Uniform values in [lo, hi): never all zeros, so an unwritten output cannot pass.
template <typename T>
std::vector<T> random_vector(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(lo + (hi - lo) * rng.uniform());
  return v;
}

// Integer values in [lo, hi], for tests that demand exact results.
template <typename T>
std::vector<T> random_integers(int64_t n, uint64_t seed, int lo, int hi) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(lo + static_cast<int>(rng.below(hi - lo + 1)));
  return v;
}

// max_i |a_i - b_i| / max(1, |b_i|); a NaN or an infinity anywhere (in either vector,
// even two equal infinities) gives +inf.
template <typename A, typename B>
double max_relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = static_cast<double>(a[i]);
    double y = static_cast<double>(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
  }
  return worst;
}

template <typename T> bool any_nonzero(const std::vector<T>& v) {
  return std::any_of(v.begin(), v.end(), [](T x) { return x != T(0); });
}

}  // namespace switchyard::testing
