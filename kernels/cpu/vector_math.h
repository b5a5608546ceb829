// Vectorisable math for the CPU kernels. The float versions avoid libm calls, which
// GCC will not vectorise without -ffast-math; the generic versions (double, for the
// tests) use <cmath>.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace switchyard::cpu {

// exp(x) for x <= 0 in float, written so that loops over it vectorize (std::exp does
// not without -ffast-math, and the softmax exponentials would cost as much as the
// GEMMs). Cephes' polynomial after reduction by ln 2; within about 1.5 ulp.
inline float exp_nonpositive(float x) {
  // Clamps x to >= -87 so 2^n stays a normal float (exp(-87) is nothing next to the row
  // max). Non-positive floats order like their bits read as unsigned; a float compare
  // here would stop GCC from vectorizing the loop (it may trap).
  x = std::bit_cast<float>(std::min(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(-87.0f)));
  const float n = static_cast<float>(static_cast<int32_t>(x * 1.44269504f - 0.5f));
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

template <typename T> T exp_nonpositive(T x) { return std::exp(x); }

// Logistic sigmoid through exp(-|x|), so it never overflows and has no data-dependent
// branch to stop vectorisation.
template <typename T> T sigmoid(T x) {
  const T e = exp_nonpositive(-std::abs(x));
  const T inv = T(1) / (T(1) + e);
  return x >= T(0) ? inv : e * inv;
}

}  // namespace switchyard::cpu
