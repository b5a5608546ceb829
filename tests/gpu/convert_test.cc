// CUDA f32 <-> bf16 conversion against the CPU's: the same bits for every non-NaN value
// (ties, subnormals, overflow to infinity), NaN kept NaN, widening exact; i32 counts to f32.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

TEST(ConvertGpu, MatchesCpuBitForBit) {
  CudaDevice gpu(0);
  std::vector<float> values = testing::random_vector<float>(100003, 1, -1e4, 1e4);
  const uint32_t specials[] = {0x3F808000, 0x3F818000, 0x3F808001, 0x00018000, 0x7F7FFFFF,
                               0x7F800000, 0xFF800000, 0x80000000, 0x7FC00000, 0x7F800001};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&values[i], &specials[i], 4);
  const Tensor f = testing::host_tensor({static_cast<int64_t>(values.size())}, values);
  Tensor b = Tensor::empty(f.shape(), DType::kBF16);
  convert(cpu_device(), f, b);
  Tensor gb = Tensor::empty(f.shape(), DType::kBF16, MemoryKind::kOther, gpu);
  convert(gpu, f.to(gpu), gb);
  const Tensor got = gb.on_host();
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float expected = to_float(b.data<bf16>()[i]);
    const float actual = to_float(got.data<bf16>()[i]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(actual)) << i;
    } else {
      ASSERT_EQ(got.data<bf16>()[i].bits, b.data<bf16>()[i].bits) << i << ": " << values[i];
    }
  }
  Tensor gf = testing::poisoned(gpu, f.shape());
  convert(gpu, gb, gf);
  const Tensor wide = gf.on_host();
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float expected = to_float(got.data<bf16>()[i]);
    if (!std::isnan(expected)) {
      ASSERT_EQ(wide.data<float>()[i], expected) << i;
    }
  }
}

// Expert counts (i32) widen to f32 exactly, as on the CPU; more than one launch's grid.
TEST(ConvertGpu, CountsWidenExactly) {
  CudaDevice gpu(0);
  std::vector<int32_t> counts(300001);
  for (size_t i = 0; i < counts.size(); ++i)
    counts[i] = static_cast<int32_t>(i * 53 % 16777217) - 7;
  const Tensor c = testing::host_tensor({static_cast<int64_t>(counts.size())}, counts);
  Tensor gf = testing::poisoned(gpu, c.shape());
  convert(gpu, c.to(gpu), gf);
  const std::vector<float> got = testing::values_of<float>(gf);
  for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(got[i], static_cast<float>(counts[i])) << i;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
