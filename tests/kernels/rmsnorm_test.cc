#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/rmsnorm.h"
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

constexpr int64_t kRows = 13, kDim = 37;
constexpr double kEps = 1e-5;

std::vector<double> naive_rmsnorm(const std::vector<double>& x, const std::vector<double>& w) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < kRows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < kDim; ++i) ss += x[r * kDim + i] * x[r * kDim + i];
    const double rstd = 1.0 / std::sqrt(ss / kDim + kEps);
    for (int64_t i = 0; i < kDim; ++i) y[r * kDim + i] = x[r * kDim + i] * rstd * w[i];
  }
  return y;
}

TEST(RmsnormTest, ForwardMatchesNaive) {
  const auto x = random_vector<double>(kRows * kDim, 1, -2, 2);
  const auto w = random_vector<double>(kDim, 2, 0.5, 1.5);
  std::vector<double> y(x.size()), rstd(kRows);
  cpu::rmsnorm_forward<double>(x.data(), w.data(), kEps, kRows, kDim, y.data(), rstd.data());
  EXPECT_LT(max_relative_error(y, naive_rmsnorm(x, w)), 1e-14);
  EXPECT_TRUE(any_nonzero(y));
}

// Enough work for the parallel loops; one thread and several must agree bit for bit.
TEST(RmsnormTest, LargeInputIsDeterministic) {
  const int64_t rows = 257, dim = 300;
  const auto x = random_vector<float>(rows * dim, 11);
  const auto w = random_vector<float>(dim, 12);
  const auto gy = random_vector<float>(rows * dim, 13);
  std::vector<float> first;
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> y(x.size()), rstd(rows), dx(x.size()), dw(dim, 0.0f);
    cpu::rmsnorm_forward<float>(x.data(), w.data(), 1e-5f, rows, dim, y.data(), rstd.data());
    cpu::rmsnorm_backward<float>(gy.data(), x.data(), w.data(), rstd.data(), rows, dim, dx.data(),
                                 dw.data());
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    if (first.empty())
      first = y;
    else
      EXPECT_EQ(y, first);
  }
  omp_set_num_threads(saved_threads);
}

// bf16 activations and/or weight run the f32 op on their widened values: bf16 outputs are
// rounded once, rstd and the accumulated dweight are exactly the f32 op's.
TEST(RmsnormTest, Bf16OperandsComputeInF32) {
  const Tensor x32 = host_tensor<float>({kRows, kDim}, random_vector<float>(kRows * kDim, 14, -2, 2));
  const Tensor w32 = host_tensor<float>({kDim}, random_vector<float>(kDim, 15, 0.5, 1.5));
  const Tensor gy32 = host_tensor<float>({kRows, kDim}, random_vector<float>(kRows * kDim, 16));
  const Tensor dw0 = host_tensor<float>({kDim}, random_vector<float>(kDim, 17));
  for (DType x_type : {DType::kF32, DType::kBF16}) {
    for (DType w_type : {DType::kF32, DType::kBF16}) {
      if (x_type == DType::kF32 && w_type == DType::kF32) continue;
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(x_type) << " activations, " << dtype_name(w_type) << " weight");
      const Tensor x = to_dtype(x32, x_type), w = to_dtype(w32, w_type),
                   dy = to_dtype(gy32, x_type);
      const Tensor xw = to_dtype(x, DType::kF32), ww = to_dtype(w, DType::kF32);
      Tensor y = Tensor::empty({kRows, kDim}, x_type), rstd = Tensor::empty({kRows});
      Tensor y32 = Tensor::empty({kRows, kDim}), rstd32 = Tensor::empty({kRows});
      rmsnorm_forward(cpu_device(), xw, ww, kEps, y32, rstd32);
      rmsnorm_forward(cpu_device(), x, w, kEps, y, rstd);
      EXPECT_TRUE(stores(y, y32));
      EXPECT_TRUE(stores(rstd, rstd32));

      Tensor dx = Tensor::empty({kRows, kDim}, x_type), dx32 = Tensor::empty({kRows, kDim});
      Tensor dw = to_dtype(dw0, DType::kF32), dw32 = to_dtype(dw0, DType::kF32);
      rmsnorm_backward(cpu_device(), to_dtype(dy, DType::kF32), xw, ww, rstd32, dx32, dw32);
      rmsnorm_backward(cpu_device(), dy, x, w, rstd, dx, dw);
      EXPECT_TRUE(stores(dx, dx32));
      EXPECT_TRUE(stores(dw, dw32));
      EXPECT_TRUE(any_nonzero(values_of<float>(dx32)));
    }
  }
}

TEST(RmsnormDeathTest, RejectsABf16WeightGradient) {
  const Tensor x = Tensor::zeros({2, 4}, DType::kBF16), w = Tensor::zeros({4});
  const Tensor rstd = Tensor::zeros({2});
  Tensor dx = Tensor::empty({2, 4}, DType::kBF16), dw = Tensor::zeros({4}, DType::kBF16);
  EXPECT_DEATH(rmsnorm_backward(cpu_device(), x, x, w, rstd, dx, dw), "rstd and dweight f32");
}

}  // namespace
}  // namespace switchyard
