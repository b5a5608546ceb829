#include "kernels/elementwise.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/elementwise.h"
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

TEST(ElementwiseTest, AddAndScale) {
  const int64_t n = 70001;
  const auto x = random_vector<float>(n, 61);
  const auto y = random_vector<float>(n, 62);
  Tensor yt = host_tensor<float>({n}, y);
  add_(cpu_device(), yt, host_tensor<float>({n}, x), -0.75f);
  std::vector<double> expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = double(y[i]) - 0.75 * double(x[i]);
  EXPECT_LT(max_relative_error(values_of<float>(yt), expected), 1e-6);

  scale_(cpu_device(), yt, 3.0f);
  for (auto& e : expected) e *= 3.0;
  EXPECT_LT(max_relative_error(values_of<float>(yt), expected), 1e-6);
  EXPECT_TRUE(any_nonzero(values_of<float>(yt)));
}

TEST(ElementwiseTest, AddBiasAndBiasBackward) {
  // Large enough for the parallel path; n not a multiple of the column block.
  const int64_t rows = 300, n = 130;
  const auto y = random_vector<float>(rows * n, 63);
  const auto bias = random_vector<float>(n, 64);
  Tensor yt = host_tensor<float>({rows, n}, y);
  add_bias_(cpu_device(), yt, host_tensor<float>({n}, bias));
  std::vector<double> expected(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) expected[r * n + i] = double(y[r * n + i]) + bias[i];
  }
  EXPECT_LT(max_relative_error(values_of<float>(yt), expected), 1e-6);

  const auto initial = random_vector<float>(n, 65);
  Tensor dbias = host_tensor<float>({n}, initial);
  bias_backward(cpu_device(), host_tensor<float>({rows, n}, y), dbias);
  std::vector<double> sums(initial.begin(), initial.end());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) sums[i] += y[r * n + i];
  }
  EXPECT_LT(max_relative_error(values_of<float>(dbias), sums), 1e-5);
}

TEST(ElementwiseTest, SumSquaresOfManyTensorsMatchOneByOne) {
  std::vector<Tensor> xs;
  for (int64_t n : {5, 0, 100003, 1}) xs.push_back(host_tensor<float>({n}, random_vector<float>(n, 70 + n)));
  const std::vector<double> sums = sum_squares(cpu_device(), xs);
  ASSERT_EQ(sums.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(sums[i], sum_squares(cpu_device(), xs[i])) << i;
  EXPECT_EQ(sums[1], 0.0);
  EXPECT_TRUE(sum_squares(cpu_device(), std::vector<Tensor>{}).empty());
  xs.push_back(to_dtype(xs[0], DType::kBF16));
  EXPECT_DEATH(sum_squares(cpu_device(), xs), "all f32 or all bf16");
}

TEST(ElementwiseTest, SumSquaresIsAccurateAndThreadCountIndependent) {
  const int64_t n = 100003;
  const auto x = random_vector<float>(n, 66, -3.0, 3.0);
  double expected = 0;
  for (float v : x) expected += double(v) * double(v);
  Tensor xt = host_tensor<float>({n}, x);
  const double got = sum_squares(cpu_device(), xt);
  EXPECT_NEAR(got, expected, 1e-12 * expected);

  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double serial = sum_squares(cpu_device(), xt);
  omp_set_num_threads(std::max(threads, 3));
  const double parallel = sum_squares(cpu_device(), xt);
  omp_set_num_threads(threads);
  EXPECT_EQ(serial, parallel);
  EXPECT_EQ(serial, got);
}

TEST(ElementwiseTest, SigmoidGateForwardMatchesDoubleReference) {
  const int64_t rows = 9, n = 21;
  const auto x = random_vector<float>(rows * n, 67);
  auto g = random_vector<float>(rows, 68, -4.0, 4.0);
  g[0] = -200.0f;  // exp(200) overflows float: the sigmoid must not.
  g[1] = 200.0f;
  const auto y = random_vector<float>(rows * n, 69);
  Tensor yt = host_tensor<float>({rows, n}, y);
  sigmoid_gate_forward(cpu_device(), host_tensor<float>({rows, n}, x), host_tensor<float>({rows, 1}, g), yt);
  std::vector<double> expected(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    const double s = 1.0 / (1.0 + std::exp(-double(g[r])));
    for (int64_t i = 0; i < n; ++i) expected[r * n + i] = y[r * n + i] + s * x[r * n + i];
  }
  EXPECT_LT(max_relative_error(values_of<float>(yt), expected), 1e-6);
}

// bf16 operands run the f32 op on their widened values and round each bf16 output once,
// whichever operands are bf16; f32 outputs and dbias are exactly the f32 op's.
TEST(ElementwiseTest, Bf16OperandsComputeInF32) {
  const int64_t rows = 37, n = 130;
  const Tensor x32 = host_tensor<float>({rows, n}, random_vector<float>(rows * n, 76));
  const Tensor y32 = host_tensor<float>({rows, n}, random_vector<float>(rows * n, 77));
  const Tensor x = to_dtype(x32, DType::kBF16);
  const Tensor bias16 = to_dtype(host_tensor<float>({n}, random_vector<float>(n, 78)), DType::kBF16);
  const Tensor g16 =
      to_dtype(host_tensor<float>({rows, 1}, random_vector<float>(rows, 79, -4, 4)), DType::kBF16);

  Tensor y = to_dtype(y32, DType::kBF16);
  Tensor expected = to_dtype(y, DType::kF32);
  add_(cpu_device(), expected, to_dtype(x, DType::kF32), -0.75f);
  add_(cpu_device(), y, x, -0.75f);
  EXPECT_TRUE(stores(y, expected));
  expected = to_dtype(y, DType::kF32);
  scale_(cpu_device(), expected, 3.0f);
  scale_(cpu_device(), y, 3.0f);
  EXPECT_TRUE(stores(y, expected));
  EXPECT_EQ(sum_squares(cpu_device(), x), sum_squares(cpu_device(), to_dtype(x, DType::kF32)));

  for (DType y_type : {DType::kF32, DType::kBF16}) {
    for (DType g_type : {DType::kF32, DType::kBF16}) {
      if (y_type == DType::kF32 && g_type == DType::kF32) continue;
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(y_type) << " rows, " << dtype_name(g_type) << " bias and gate");
      const Tensor bias = to_dtype(bias16, g_type);
      y = to_dtype(y32, y_type);
      expected = to_dtype(y, DType::kF32);
      add_bias_(cpu_device(), expected, to_dtype(bias, DType::kF32));
      add_bias_(cpu_device(), y, bias);
      EXPECT_TRUE(stores(y, expected));

      const Tensor xs = to_dtype(x, y_type), g = to_dtype(g16, g_type);
      const Tensor xs32 = to_dtype(xs, DType::kF32), g32 = to_dtype(g, DType::kF32);
      expected = to_dtype(y, DType::kF32);
      sigmoid_gate_forward(cpu_device(), xs32, g32, expected);
      sigmoid_gate_forward(cpu_device(), xs, g, y);
      EXPECT_TRUE(stores(y, expected));

      const Tensor dy = to_dtype(y32, y_type);
      Tensor dx = Tensor::empty({rows, n}, y_type), dg = Tensor::empty({rows, 1}, g_type);
      Tensor dx32 = Tensor::empty({rows, n}), dg32 = Tensor::empty({rows, 1});
      sigmoid_gate_backward(cpu_device(), to_dtype(dy, DType::kF32), xs32, g32, dx32, dg32);
      sigmoid_gate_backward(cpu_device(), dy, xs, g, dx, dg);
      EXPECT_TRUE(stores(dx, dx32));
      EXPECT_TRUE(stores(dg, dg32));
      EXPECT_TRUE(any_nonzero(values_of<float>(dg32)));
    }
  }

  const Tensor dbias0 = host_tensor<float>({n}, random_vector<float>(n, 80));
  Tensor dbias = to_dtype(dbias0, DType::kF32), dbias_expected = to_dtype(dbias0, DType::kF32);
  bias_backward(cpu_device(), to_dtype(x, DType::kF32), dbias_expected);
  bias_backward(cpu_device(), x, dbias);
  EXPECT_TRUE(stores(dbias, dbias_expected));
}

TEST(ElementwiseDeathTest, RejectsMixedOperandTypes) {
  Tensor y = Tensor::empty({4, 3}, DType::kBF16);
  const Tensor x = Tensor::zeros({4, 3});
  EXPECT_DEATH(add_(cpu_device(), y, x), "both f32 or both bf16");
  Tensor dbias = Tensor::zeros({3}, DType::kBF16);
  EXPECT_DEATH(bias_backward(cpu_device(), x, dbias), "dbias f32");
  Tensor dx = Tensor::empty({4, 3}), dg = Tensor::empty({4, 1});
  EXPECT_DEATH(
      sigmoid_gate_backward(cpu_device(), x, x, Tensor::zeros({4, 1}, DType::kBF16), dx, dg),
      "g and dg both f32 or both bf16");
}

}  // namespace
}  // namespace switchyard
