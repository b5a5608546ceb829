#include "kernels/muon.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/threads.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_vector;
using testing::values_of;

constexpr NewtonSchulz kPublished{5, 3.4445f, -4.7750f, 2.0315f, 1e-7f};

// A row-major matrix in double.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double& at(int64_t r, int64_t c) { return v[r * cols + c]; }
  double at(int64_t r, int64_t c) const { return v[r * cols + c]; }
};

Matrix transposed(const Matrix& m) {
  Matrix t{m.cols, m.rows, std::vector<double>(m.v.size())};
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) t.at(c, r) = m.at(r, c);
  return t;
}

Matrix product(const Matrix& a, const Matrix& b) {
  Matrix out{a.rows, b.cols, std::vector<double>(a.rows * b.cols, 0.0)};
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t k = 0; k < a.cols; ++k)
      for (int64_t j = 0; j < b.cols; ++j) out.at(i, j) += a.at(i, k) * b.at(k, j);
  return out;
}

// x * s + y * t elementwise.
Matrix combined(const Matrix& x, double s, const Matrix& y, double t) {
  Matrix out = x;
  for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = x.v[i] * s + y.v[i] * t;
  return out;
}

// zeropower_via_newtonschulz5 of the published Muon, in double: transposed to the wide
// orientation, divided by its Frobenius norm plus eps, then X = a X + (b A + c A A) X
// with A = X X^T.
Matrix reference_orthogonalize(const Matrix& g, const NewtonSchulz& ns) {
  const bool tall = g.rows > g.cols;
  Matrix x = tall ? transposed(g) : g;
  double squares = 0;
  for (double e : x.v) squares += e * e;
  for (double& e : x.v) e /= std::sqrt(squares) + ns.eps;
  for (int step = 0; step < ns.steps; ++step) {
    const Matrix a = product(x, transposed(x));
    const Matrix b = combined(a, ns.b, product(a, a), ns.c);
    x = combined(x, ns.a, product(b, x), 1.0);
  }
  return tall ? transposed(x) : x;
}

// One step of Moonlight's Muon on `count` (rows, cols) matrices in double: B = mu B + G,
// Nesterov input G + mu B, orthogonalised, then W = W (1 - lr wd) - lr 0.2 sqrt(max(rows,
// cols)) X.
struct Reference {
  int64_t count, rows, cols;
  std::vector<double> param, momentum;

  void step(const std::vector<double>& grad, double mu, double lr, double wd) {
    const int64_t n = rows * cols;
    std::vector<double> input(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) {
      momentum[i] = mu * momentum[i] + grad[i];
      input[i] = grad[i] + mu * momentum[i];
    }
    const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
    for (int64_t m = 0; m < count; ++m) {
      Matrix g{rows, cols, std::vector<double>(input.begin() + m * n, input.begin() + (m + 1) * n)};
      const Matrix x = reference_orthogonalize(g, kPublished);
      for (int64_t i = 0; i < n; ++i) {
        double& w = param[m * n + i];
        w = w * (1 - lr * wd) - lr * scale * x.v[i];
      }
    }
  }
};

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class MuonReferenceTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(MuonReferenceTest, OrthogonalizationMatchesDoubleReference) {
  const int64_t count = GetParam()[0], rows = GetParam()[1], cols = GetParam()[2];
  const auto g = random_vector<float>(count * rows * cols, 11, -2.0, 2.0);
  Tensor x = host_tensor<float>({count, rows, cols}, g);
  muon_orthogonalize(cpu_device(), kPublished, x, rows, cols);
  const std::vector<float> got = values_of<float>(x);
  ASSERT_TRUE(any_nonzero(got));
  const int64_t n = rows * cols;
  for (int64_t m = 0; m < count; ++m) {
    const Matrix want = reference_orthogonalize(
        {rows, cols, std::vector<double>(g.begin() + m * n, g.begin() + (m + 1) * n)},
        kPublished);
    const std::vector<float> mine(got.begin() + m * n, got.begin() + (m + 1) * n);
    EXPECT_LT(max_relative_error(mine, want.v), 2e-5) << "matrix " << m;
    // Five iterations leave every singular value near 1: the squared norm is about
    // min(rows, cols).
    double squares = 0;
    for (double e : want.v) squares += e * e;
    EXPECT_NEAR(squares / static_cast<double>(std::min(rows, cols)), 1.0, 0.3);
  }
}

TEST_P(MuonReferenceTest, StepsMatchDoubleReference) {
  const int64_t count = GetParam()[0], rows = GetParam()[1], cols = GetParam()[2];
  const int64_t n = count * rows * cols;
  const float mu = 0.95f, lr = 0.02f, wd = 0.1f, grad_scale = 1.0f;
  const auto param0 = random_vector<float>(n, 3, -0.5, 0.5);
  Tensor param = host_tensor<float>({count, rows, cols}, param0);
  Tensor momentum = Tensor::zeros({count, rows, cols});
  Tensor input = Tensor::zeros({count, rows, cols});
  Reference ref{count, rows, cols, widen(param0), std::vector<double>(n, 0.0)};
  for (int step = 1; step <= 3; ++step) {
    const auto grad = random_vector<float>(n, 20 + step, -1.0, 1.0);
    muon_momentum(cpu_device(), mu, true, grad_scale, host_tensor<float>({count, rows, cols}, grad),
                  momentum, input);
    muon_orthogonalize(cpu_device(), kPublished, input, rows, cols);
    muon_apply(cpu_device(), lr, wd, muon_update_scale(0.2, rows, cols), param, input, nullptr);
    ref.step(widen(grad), mu, lr, wd);
  }
  EXPECT_LT(max_relative_error(values_of<float>(momentum), ref.momentum), 1e-6);
  // The update moves each weight by about lr * 0.2; float's rounding of the iterations
  // stays far below that.
  EXPECT_LT(max_relative_error(values_of<float>(param), ref.param), 1e-6);
  EXPECT_GT(max_relative_error(param0, ref.param), 1e-3);  // the weights moved
}

INSTANTIATE_TEST_SUITE_P(Shapes, MuonReferenceTest,
                         ::testing::Values(std::vector<int64_t>{1, 12, 20},   // wide
                                           std::vector<int64_t>{1, 20, 12},   // tall
                                           std::vector<int64_t>{1, 16, 16},   // square
                                           std::vector<int64_t>{3, 8, 10}));  // stacked

TEST(MuonTest, WithoutNesterovTheMomentumIsTheInput) {
  const auto grad = random_vector<float>(6, 5);
  const auto momentum0 = random_vector<float>(6, 6);
  Tensor momentum = host_tensor<float>(momentum0);
  Tensor input = Tensor::zeros({6});
  muon_momentum(cpu_device(), 0.9f, false, 0.5f, host_tensor<float>(grad), momentum, input);
  const std::vector<float> got = values_of<float>(momentum);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_FLOAT_EQ(got[i], 0.9f * momentum0[i] + 0.5f * grad[i]);
  EXPECT_EQ(values_of<float>(input), got);
}

TEST(MuonTest, BatchInvariantMatrixIgnoresItsNeighbours) {
  // Under runtime.batch_invariant an expert's matrix gives the same bits whichever
  // experts share its tensor, as expert parallelism regroups them.
  const bool before = batch_invariant();
  set_batch_invariant(true);
  const int64_t rows = 24, cols = 40;
  const auto g = random_vector<float>(3 * rows * cols, 17);
  Tensor stacked = host_tensor<float>({3, rows, cols}, g);
  muon_orthogonalize(cpu_device(), kPublished, stacked, rows, cols);
  Tensor alone = host_tensor<float>(
      {1, rows, cols}, std::vector<float>(g.begin() + rows * cols, g.begin() + 2 * rows * cols));
  muon_orthogonalize(cpu_device(), kPublished, alone, rows, cols);
  set_batch_invariant(before);
  const std::vector<float> all = values_of<float>(stacked);
  EXPECT_EQ(values_of<float>(alone),
            std::vector<float>(all.begin() + rows * cols, all.begin() + 2 * rows * cols));
}

TEST(MuonTest, UpdateScaleGivesTheRequestedRms) {
  EXPECT_DOUBLE_EQ(muon_update_scale(0.2, 16, 64), 1.6);
  EXPECT_DOUBLE_EQ(muon_update_scale(0.2, 64, 16), 1.6);
}

}  // namespace
}  // namespace switchyard
