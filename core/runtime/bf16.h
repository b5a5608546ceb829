// bfloat16 on the host: the upper 16 bits of an IEEE binary32. Narrowing rounds to
// nearest, ties to even (as the CUDA conversions and PyTorch do); a NaN stays a quiet NaN.
// Widening is exact.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace switchyard {

struct bf16 {
  uint16_t bits = 0;
};

inline bf16 to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  // Rounding could carry a NaN's payload into the infinity pattern: keep it a NaN.
  if (std::isnan(value)) return bf16{static_cast<uint16_t>((bits >> 16) | 0x40)};
  bits += 0x7FFF + ((bits >> 16) & 1);
  return bf16{static_cast<uint16_t>(bits >> 16)};
}

inline float to_float(bf16 value) {
  const uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace switchyard
