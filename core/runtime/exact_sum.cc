#include "core/runtime/exact_sum.h"

#include <bit>
#include <cmath>
#include <limits>

namespace switchyard {
namespace {

constexpr int kNaN = ExactSum::kValueLimbs;
constexpr int kPlusInf = kNaN + 1;
constexpr int kMinusInf = kNaN + 2;
// Each addition adds less than 2^32 to a limb; normalising this often keeps every limb
// far inside int64.
constexpr int64_t kNormalizeEvery = int64_t{1} << 29;

}  // namespace

void ExactSum::add(double v) {
  if (std::isnan(v)) {
    ++limbs_[kNaN];
    return;
  }
  if (std::isinf(v)) {
    ++limbs_[v > 0 ? kPlusInf : kMinusInf];
    return;
  }
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  const uint64_t biased = (bits >> 52) & 0x7ff;
  uint64_t mantissa = bits & ((uint64_t{1} << 52) - 1);
  if (mantissa == 0 && biased == 0) return;
  // v = mantissa * 2^(offset - 1074): a subnormal's offset is 0.
  if (biased != 0) mantissa |= uint64_t{1} << 52;
  const int offset = biased == 0 ? 0 : static_cast<int>(biased) - 1;
  const int limb = offset / 32;
  const unsigned __int128 wide = static_cast<unsigned __int128>(mantissa) << (offset % 32);
  const int64_t sign = (bits >> 63) ? -1 : 1;
  for (int k = 0; k < 3; ++k)
    limbs_[limb + k] += sign * static_cast<int64_t>((wide >> (32 * k)) & 0xffffffffu);
  if (++pending_ >= kNormalizeEvery) normalize();
}

void ExactSum::add(const ExactSum& other) {
  ExactSum normalized = other;
  normalized.normalize();
  normalize();
  for (int i = 0; i < kSize; ++i) limbs_[i] += normalized.limbs_[i];
  pending_ = 1;
}

void ExactSum::normalize() {
  for (int i = 0; i + 1 < kValueLimbs; ++i) {
    const int64_t carry = limbs_[i] >> 32;  // floor: the limb keeps [0, 2^32)
    limbs_[i] -= carry * (int64_t{1} << 32);
    limbs_[i + 1] += carry;
  }
  pending_ = 0;
}

double ExactSum::value() const {
  if (limbs_[kNaN] > 0 || (limbs_[kPlusInf] > 0 && limbs_[kMinusInf] > 0))
    return std::numeric_limits<double>::quiet_NaN();
  if (limbs_[kPlusInf] > 0) return std::numeric_limits<double>::infinity();
  if (limbs_[kMinusInf] > 0) return -std::numeric_limits<double>::infinity();
  ExactSum x = *this;
  x.normalize();
  const bool negative = x.limbs_[kValueLimbs - 1] < 0;
  if (negative) {
    for (int i = 0; i < kValueLimbs; ++i) x.limbs_[i] = -x.limbs_[i];
    x.normalize();
  }
  int top = kValueLimbs - 1;
  while (top >= 0 && x.limbs_[top] == 0) --top;
  if (top < 0) return 0.0;
  // The top three limbs hold at least 65 significant bits; any bit below them is jammed
  // into the lowest, so the one conversion to double rounds as the whole sum would.
  unsigned __int128 window = 0;
  for (int i = top; i >= top - 2; --i)
    window = (window << 32) | static_cast<uint64_t>(i >= 0 ? x.limbs_[i] : 0);
  for (int i = top - 3; i >= 0; --i)
    if (x.limbs_[i] != 0) {
      window |= 1;
      break;
    }
  const double magnitude = std::ldexp(static_cast<double>(window), 32 * (top - 2) - 1074);
  return negative ? -magnitude : magnitude;
}

}  // namespace switchyard
