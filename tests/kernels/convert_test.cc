// f32 <-> bf16 conversion: round to nearest even, NaN and infinity kept, widening exact;
// and the CPU's widen-compute-store path for ops on bf16 operands.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace switchyard {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3F80);
  // Exactly halfway between two bf16 values: to the even one.
  EXPECT_EQ(to_bf16(from_bits(0x3F808000)).bits, 0x3F80);
  EXPECT_EQ(to_bf16(from_bits(0x3F818000)).bits, 0x3F82);
  // Just above halfway: up.
  EXPECT_EQ(to_bf16(from_bits(0x3F808001)).bits, 0x3F81);
  EXPECT_EQ(to_bf16(-2.5f).bits, 0xC020);
  // The largest float rounds to infinity; infinities and zeros stay.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7F80);
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
  // A NaN whose payload would round into the infinity pattern stays a NaN.
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7F800001)))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Subnormals round like any other value.
  EXPECT_EQ(to_bf16(from_bits(0x00018000)).bits, 0x0002);
}

TEST(Bf16, WideningIsExactAndRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const bf16 v{static_cast<uint16_t>(bits)};
    const float f = to_float(v);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_bf16(f).bits, v.bits);
  }
}

TEST(Convert, ConvertsTensorsBothWays) {
  const int64_t n = 70000;  // past the OpenMP threshold
  Tensor f = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) f.data<float>()[i] = 0.001f * static_cast<float>(i - n / 2);
  Tensor b = Tensor::empty({n}, DType::kBF16);
  convert(cpu_device(), f, b);
  Tensor back = Tensor::empty({n});
  convert(cpu_device(), b, back);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(b.data<bf16>()[i].bits, to_bf16(f.data<float>()[i]).bits) << i;
    ASSERT_EQ(back.data<float>()[i], to_float(b.data<bf16>()[i])) << i;
  }
  Tensor wrong = Tensor::empty({n}, DType::kI32);
  EXPECT_DEATH(convert(cpu_device(), f, wrong), "f32 and bf16 tensors, or i32 to f32, only");
}

// Counts (i32) widen exactly to f32 up to 2^24; nothing converts to i32.
TEST(Convert, CountsWidenToF32) {
  const std::vector<int32_t> counts = {0, 1, -3, 12345, 1 << 24};
  Tensor c = Tensor::empty({5}, DType::kI32);
  std::copy(counts.begin(), counts.end(), c.data<int32_t>());
  Tensor f = Tensor::empty({5});
  convert(cpu_device(), c, f);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f.data<float>()[i], static_cast<float>(counts[i]));
  Tensor b = Tensor::empty({5}, DType::kBF16);
  EXPECT_DEATH(convert(cpu_device(), c, b), "or i32 to f32, only");
}

TEST(Convert, WidenedAndStoreRunAnF32OpForBf16Operands) {
  Tensor x = Tensor::empty({3}, DType::kBF16);
  for (int i = 0; i < 3; ++i) x.data<bf16>()[i] = to_bf16(1.0f + static_cast<float>(i) / 3.0f);
  EXPECT_TRUE(any_bf16({&x}));
  const Tensor wide = widened(x);
  ASSERT_EQ(wide.dtype(), DType::kF32);
  EXPECT_EQ(wide.data<float>()[1], to_float(x.data<bf16>()[1]));
  // An f32 tensor is its own widened form, and storing it into itself does nothing.
  Tensor y = Tensor::empty({3});
  EXPECT_EQ(widened(y).raw_data(), y.raw_data());
  EXPECT_FALSE(any_bf16({&y}));
  for (int i = 0; i < 3; ++i) y.data<float>()[i] = wide.data<float>()[i] * 3.0f;
  store(cpu_device(), y, y);
  Tensor out = Tensor::empty({3}, DType::kBF16);
  store(cpu_device(), y, out);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out.data<bf16>()[i].bits, to_bf16(y.data<float>()[i]).bits);
}

}  // namespace
}  // namespace switchyard
