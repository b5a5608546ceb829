#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/rope.h"
#include "tests/bf16_test_util.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::stores;
using testing::to_dtype;

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_vector;
using testing::values_of;

constexpr int64_t kBatch = 2, kSeq = 7, kHeads = 3, kHeadDim = 10;
constexpr int64_t kNumel = kBatch * kSeq * kHeads * kHeadDim;
constexpr float kTheta = 10000.0f;

// The angle transformers computes: fp32 inverse frequency, fp32 product.
float reference_angle(int64_t p, int64_t i, int64_t d) {
  const float inv_freq = 1.0f / powf(kTheta, static_cast<float>(2 * i) / static_cast<float>(d));
  return static_cast<float>(p) * inv_freq;
}

// Explicit rotate-half: out[j] = x[j] cos - x[j+d/2] sin, out[j+d/2] = x[j+d/2] cos + x[j] sin.
std::vector<double> reference_rope(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  const int64_t half = kHeadDim / 2;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t p = 0; p < kSeq; ++p) {
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t base = ((b * kSeq + p) * kHeads + h) * kHeadDim;
        for (int64_t j = 0; j < half; ++j) {
          const double angle = reference_angle(p, j, kHeadDim);
          const double c = std::cos(angle), s = std::sin(angle);
          out[base + j] = x[base + j] * c - x[base + j + half] * s;
          out[base + j + half] = x[base + j + half] * c + x[base + j] * s;
        }
      }
    }
  }
  return out;
}

TEST(RopeTest, TableMatchesTransformersFormula) {
  const int64_t seq = 4096, d = 128;
  Tensor table = rope_table(seq, d, kTheta);
  ASSERT_EQ(table.shape(), (Shape{seq, d / 2, 2}));
  std::vector<double> expected;
  for (int64_t p = 0; p < seq; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double angle = reference_angle(p, i, d);
      expected.push_back(std::cos(angle));
      expected.push_back(std::sin(angle));
    }
  }
  EXPECT_LT(max_relative_error(values_of<float>(table), expected), 1e-7);
}

TEST(RopeTest, ForwardMatchesRotateHalf) {
  auto x = random_vector<double>(kNumel, 1);
  const auto expected = reference_rope(x);
  std::vector<double> table(kSeq * kHeadDim);
  cpu::rope_table<double>(kSeq, kHeadDim, kTheta, table.data());
  cpu::rope_forward<double>(table.data(), x.data(), kBatch, kSeq, kHeads, kHeadDim);
  EXPECT_LT(max_relative_error(x, expected), 1e-14);
  EXPECT_TRUE(any_nonzero(x));
}

TEST(RopeTest, BackwardUndoesForward) {
  auto x = random_vector<double>(kNumel, 6);
  const auto original = x;
  std::vector<double> table(kSeq * kHeadDim);
  cpu::rope_table<double>(kSeq, kHeadDim, kTheta, table.data());
  cpu::rope_forward<double>(table.data(), x.data(), kBatch, kSeq, kHeads, kHeadDim);
  EXPECT_GT(max_relative_error(x, original), 1e-3);
  cpu::rope_backward<double>(table.data(), x.data(), kBatch, kSeq, kHeads, kHeadDim);
  EXPECT_LT(max_relative_error(x, original), 1e-14);
}

// A bf16 x is rotated in f32 by the f32 table and rounded once per element.
TEST(RopeTest, Bf16OperandsComputeInF32) {
  const Tensor table = rope_table(kSeq, kHeadDim, kTheta);
  const Shape shape = {kBatch, kSeq, kHeads, kHeadDim};
  Tensor x = to_dtype(host_tensor<float>(shape, random_vector<float>(kNumel, 7)), DType::kBF16);
  Tensor expected = to_dtype(x, DType::kF32);
  rope_forward(cpu_device(), table, expected);
  rope_forward(cpu_device(), table, x);
  EXPECT_TRUE(stores(x, expected));
  EXPECT_TRUE(any_nonzero(values_of<float>(expected)));
  expected = to_dtype(x, DType::kF32);
  rope_backward(cpu_device(), table, expected);
  rope_backward(cpu_device(), table, x);
  EXPECT_TRUE(stores(x, expected));
}

// YaRN's table against its definition (core/config/recipe.proto) in double, at
// DeepSeek-V3's published factor and context: pairs 0-1 keep their frequency, 2-6 are
// on the ramp, 7 is divided by the factor.
TEST(RopeTest, YarnTableMatchesItsDefinition) {
  const YarnScaling yarn{.factor = 40, .original_max_positions = 4096, .beta_fast = 32,
                         .beta_slow = 1, .mscale = 0.7, .mscale_all_dim = 1};
  const int64_t seq = 40, d = 16;
  const Tensor table = yarn_rope_table(seq, d, kTheta, yarn);
  auto correction = [&](double rotations) {
    return d * std::log(4096 / (rotations * 2 * M_PI)) / (2 * std::log(double{kTheta}));
  };
  const double low = std::max(std::floor(correction(32)), 0.0);
  const double high = std::min(std::ceil(correction(1)), d - 1.0);
  ASSERT_EQ(low, 2);
  ASSERT_EQ(high, 6);
  const double attention = (0.07 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1);
  for (int64_t i = 0; i < d / 2; ++i) {
    const double e = std::pow(double{kTheta}, -2.0 * i / d);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double freq = e * (1 - ramp) + e / 40 * ramp;
    for (int64_t p = 0; p < seq; ++p) {
      const float* cs = table.data<float>() + (p * d / 2 + i) * 2;
      EXPECT_NEAR(cs[0], std::cos(p * freq) * attention, 2e-6) << "pair " << i << " position " << p;
      EXPECT_NEAR(cs[1], std::sin(p * freq) * attention, 2e-6) << "pair " << i << " position " << p;
    }
  }
  EXPECT_DOUBLE_EQ(yarn_mscale(1.0, 5.0), 1.0);
  EXPECT_DOUBLE_EQ(yarn_mscale(std::exp(2.0), 0.5), 1.1);
}

TEST(RopeDeathTest, RejectsABf16Table) {
  const Tensor table = to_dtype(rope_table(kSeq, kHeadDim, kTheta), DType::kBF16);
  Tensor x = Tensor::zeros({kBatch, kSeq, kHeads, kHeadDim}, DType::kBF16);
  EXPECT_DEATH(rope_forward(cpu_device(), table, x), "the table must be f32");
}

}  // namespace
}  // namespace switchyard
