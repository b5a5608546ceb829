#include "kernels/swiglu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/swiglu.h"
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

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Naive reference: silu(a) = a / (1 + exp(-a)).
std::vector<double> reference_swiglu(const std::vector<double>& gate_up, int64_t rows,
                                     int64_t inter) {
  std::vector<double> out(rows * inter);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const double a = gate_up[r * 2 * inter + i];
      const double u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = a / (1.0 + std::exp(-a)) * u;
    }
  }
  return out;
}

TEST(SwigluTest, ForwardMatchesDoubleReference) {
  const int64_t rows = 7, inter = 13;
  const auto gate_up = random_vector<float>(rows * 2 * inter, 1, -4.0, 4.0);
  Tensor gu = host_tensor<float>({rows, 2 * inter}, gate_up);
  Tensor out = Tensor::empty({rows, inter});
  swiglu_forward(cpu_device(), gu, out);
  const auto got = values_of<float>(out);
  EXPECT_TRUE(any_nonzero(got));
  EXPECT_LT(max_relative_error(got, reference_swiglu(to_double(gate_up), rows, inter)), 1e-5);
}

TEST(SwigluTest, ForwardStableForLargeMagnitudes) {
  const std::vector<double> gate_up = {-1000.0, -80.0, 80.0, 1000.0, 2.0, 2.0, 2.0, 2.0};
  std::vector<double> out(4);
  cpu::swiglu_forward(gate_up.data(), out.data(), 1, 4);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_NEAR(out[1], -80.0 * 2.0 * std::exp(-80.0), 1e-40);
  EXPECT_DOUBLE_EQ(out[2], 160.0);
  EXPECT_DOUBLE_EQ(out[3], 2000.0);

  std::vector<double> dgate_up(8);
  const std::vector<double> dout(4, 1.0);
  cpu::swiglu_backward(dout.data(), gate_up.data(), dgate_up.data(), 1, 4);
  for (double d : dgate_up) EXPECT_TRUE(std::isfinite(d));
  EXPECT_DOUBLE_EQ(dgate_up[3], 2.0);
}

// bf16 operands run the f32 op on their widened values and round each output once.
TEST(SwigluTest, Bf16OperandsComputeInF32) {
  const int64_t rows = 9, inter = 11;
  const Tensor gate_up =
      to_dtype(host_tensor<float>({rows, 2 * inter}, random_vector<float>(rows * 2 * inter, 6, -4.0, 4.0)),
               DType::kBF16);
  const Tensor dout =
      to_dtype(host_tensor<float>({rows, inter}, random_vector<float>(rows * inter, 7)), DType::kBF16);
  const Tensor gate_up32 = to_dtype(gate_up, DType::kF32);
  Tensor out = Tensor::empty({rows, inter}, DType::kBF16), out32 = Tensor::empty({rows, inter});
  swiglu_forward(cpu_device(), gate_up32, out32);
  swiglu_forward(cpu_device(), gate_up, out);
  EXPECT_TRUE(stores(out, out32));
  EXPECT_TRUE(any_nonzero(values_of<float>(out32)));

  Tensor dgate_up = Tensor::empty({rows, 2 * inter}, DType::kBF16);
  Tensor dgate_up32 = Tensor::empty({rows, 2 * inter});
  swiglu_backward(cpu_device(), to_dtype(dout, DType::kF32), gate_up32, dgate_up32);
  swiglu_backward(cpu_device(), dout, gate_up, dgate_up);
  EXPECT_TRUE(stores(dgate_up, dgate_up32));
  EXPECT_TRUE(any_nonzero(values_of<float>(dgate_up32)));
}

TEST(SwigluDeathTest, RejectsMixedOperandTypes) {
  const Tensor gate_up = Tensor::zeros({2, 6}, DType::kBF16);
  Tensor out = Tensor::empty({2, 3});
  EXPECT_DEATH(swiglu_forward(cpu_device(), gate_up, out), "both f32 or both bf16");
}

}  // namespace
}  // namespace switchyard
