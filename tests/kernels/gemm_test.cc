#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/threads.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_integers;
using testing::random_vector;
using testing::values_of;

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// c = alpha op(a) op(b) + beta c, with a, b, c stored row-major with the given strides.
std::vector<double> naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                               const std::vector<double>& a, int64_t lda,
                               const std::vector<double>& b, int64_t ldb, double beta,
                               std::vector<double> c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[p * lda + i] : a[i * lda + p];
        const double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += x * y;
      }
      c[i * ldc + j] = alpha * acc + beta * c[i * ldc + j];
    }
  }
  return c;
}

TEST(GemmTest, DoubleMatchesNaiveForAllTransposesAndStrides) {
  const int64_t m = 7, n = 13, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Leading dimensions larger than the row length exercise strided access.
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
      const auto a = random_vector<double>((ta ? k : m) * lda, 1);
      const auto b = random_vector<double>((tb ? n : k) * ldb, 2);
      auto c = random_vector<double>(m * ldc, 3);
      const auto expected = naive_gemm(ta, tb, m, n, k, 0.7, a, lda, b, ldb, -1.3, c, ldc);
      cpu::gemm<double>(ta, tb, m, n, k, 0.7, a.data(), lda, b.data(), ldb, -1.3, c.data(), ldc);
      EXPECT_LT(max_relative_error(c, expected), 1e-13) << "ta=" << ta << " tb=" << tb;
      EXPECT_TRUE(any_nonzero(c));
    }
  }
}

TEST(GemmTest, EmptyInnerDimensionOnlyScales) {
  std::vector<double> c = {1, 2, 3, 4, 5, 6};
  cpu::gemm<double>(false, false, 2, 3, 0, 1.0, nullptr, 0, nullptr, 3, 2.0, c.data(), 3);
  EXPECT_EQ(c, (std::vector<double>{2, 4, 6, 8, 10, 12}));
}

TEST(GemmTest, MatmulIsExactOnIntegers) {
  const int64_t m = 9, n = 11, k = 6;
  const auto a = random_integers<float>(m * k, 4, -4, 4);
  const auto b = random_integers<float>(n * k, 5, -4, 4);
  Tensor ta = host_tensor<float>({m, k}, a), tb = host_tensor<float>({n, k}, b);
  Tensor tc = Tensor::empty({m, n});
  matmul(cpu_device(), ta, false, tb, true, tc);
  const auto expected = naive_gemm(false, true, m, n, k, 1, to_double(a), k, to_double(b), k, 0,
                                   std::vector<double>(m * n), n);
  EXPECT_EQ(to_double(values_of<float>(tc)), expected);
  EXPECT_TRUE(any_nonzero(values_of<float>(tc)));
}

TEST(GemmTest, MatmulReadsHigherRankAsMatrices) {
  // a: (2, 3, 5) is a (6, 5) matrix; a^T @ b with b: (6, 7) gives (5, 7).
  const auto a = random_vector<float>(30, 6);
  const auto b = random_vector<float>(42, 7);
  auto c = random_vector<float>(35, 8);
  Tensor ta = host_tensor<float>({2, 3, 5}, a), tb = host_tensor<float>({6, 7}, b), tc = host_tensor<float>({5, 7}, c);
  matmul(cpu_device(), ta, true, tb, false, tc, 0.5f, 2.0f);
  const auto expected =
      naive_gemm(true, false, 5, 7, 6, 0.5, to_double(a), 5, to_double(b), 7, 2.0, to_double(c), 7);
  EXPECT_LT(max_relative_error(values_of<float>(tc), expected), 1e-5);
  EXPECT_TRUE(any_nonzero(values_of<float>(tc)));
}

// The batch-invariant mode's products (kernels/cpu/fixed_order_gemm.h): right against
// the double reference, and each element's bits independent of the rows and columns
// beside it, of the thread count, and of a sum over rows cut into several calls.
class FixedOrderGemmTest : public ::testing::Test {
 protected:
  // Sizes off the tiles' multiples (6 rows, 16 columns), so that edge tiles meet full
  // ones.
  static constexpr int64_t kM = 37, kN = 70, kK = 300;

  // op(a): (m, k) and op(b): (k, n) stored as the transposes ask; c = a b in fixed order.
  struct Operands {
    bool ta, tb;
    std::vector<float> a, b;
    int64_t lda() const { return ta ? kM : kK; }
    int64_t ldb() const { return tb ? kK : kN; }
    float a_at(int64_t i, int64_t p) const { return ta ? a[p * kM + i] : a[i * kK + p]; }
  };
  static Operands operands(bool ta, bool tb) {
    return {ta, tb, random_vector<float>(kM * kK, 50), random_vector<float>(kK * kN, 51)};
  }
  static std::vector<float> product(const Operands& o, int64_t m, const float* a) {
    std::vector<float> c(m * kN, std::nanf(""));  // beta = 0 never reads c
    cpu::gemm_fixed_order<float>(o.ta, o.tb, m, kN, kK, 1.0f, a, o.lda(), o.b.data(), o.ldb(),
                                 0.0f, c.data(), kN);
    return c;
  }
};

TEST_F(FixedOrderGemmTest, MatchesTheDoubleReferenceWithAlphaAndBeta) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Operands o = operands(ta, tb);
      auto c = random_vector<float>(kM * kN, 52);
      const auto expected = naive_gemm(ta, tb, kM, kN, kK, 0.5, to_double(o.a), o.lda(),
                                       to_double(o.b), o.ldb(), -2.0, to_double(c), kN);
      cpu::gemm_fixed_order<float>(ta, tb, kM, kN, kK, 0.5f, o.a.data(), o.lda(), o.b.data(),
                                   o.ldb(), -2.0f, c.data(), kN);
      EXPECT_LT(max_relative_error(to_double(c), expected), 1e-5) << ta << tb;
      EXPECT_TRUE(any_nonzero(c));
    }
  }
}

TEST_F(FixedOrderGemmTest, EachRowIsTheSameAloneOrInABatch) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Operands o = operands(ta, tb);
      const std::vector<float> whole = product(o, kM, o.a.data());
      for (int64_t first : {0, 3, 5, 36}) {
        for (int64_t rows : {1, 2, 4}) {
          if (first + rows > kM) continue;
          // The rows [first, first + rows) of op(a) as a matrix of their own.
          std::vector<float> part(rows * kK);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t p = 0; p < kK; ++p) part[ta ? p * rows + i : i * kK + p] = o.a_at(first + i, p);
          std::vector<float> c(rows * kN);
          cpu::gemm_fixed_order<float>(ta, tb, rows, kN, kK, 1.0f, part.data(), ta ? rows : kK,
                                       o.b.data(), o.ldb(), 0.0f, c.data(), kN);
          const std::vector<float> expected(whole.begin() + first * kN,
                                            whole.begin() + (first + rows) * kN);
          EXPECT_EQ(c, expected) << "rows " << first << "+" << rows << " ta=" << ta << " tb=" << tb;
        }
      }
    }
  }
}

TEST_F(FixedOrderGemmTest, ThreadCountDoesNotChangeABit) {
  // Large enough for the kernel to thread: 256 x 256 x 64.
  const int64_t m = 256, n = 256, k = 64;
  const auto a = random_vector<float>(m * k, 53), b = random_vector<float>(n * k, 54);
  auto run = [&](int threads) {
    set_cpu_threads(threads);
    std::vector<float> c(m * n);
    cpu::gemm_fixed_order<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                                 c.data(), n);
    return c;
  };
  const std::vector<float> one = run(1), three = run(3);
  set_cpu_threads(0);
  EXPECT_EQ(one, three);
  EXPECT_TRUE(any_nonzero(one));
}

// A weight gradient dW += X^T dY over rows cut into calls (micro-batches), in order, gives
// the bits of one call over all the rows: the chain goes on from c.
TEST_F(FixedOrderGemmTest, ASumOverRowsCutIntoCallsIsOneCall) {
  const int64_t tokens = 600, in = 37, out = 70;
  const auto x = random_vector<float>(tokens * in, 55), dy = random_vector<float>(tokens * out, 56);
  const auto start = random_vector<float>(in * out, 57);
  std::vector<float> whole = start, cut = start;
  cpu::gemm_fixed_order<float>(true, false, in, out, tokens, 1.0f, x.data(), in, dy.data(), out,
                               1.0f, whole.data(), out);
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 7}, {7, 8}, {8, 400}, {400, 600}}) {
    cpu::gemm_fixed_order<float>(true, false, in, out, end - begin, 1.0f, x.data() + begin * in,
                                 in, dy.data() + begin * out, out, 1.0f, cut.data(), out);
  }
  EXPECT_EQ(cut, whole);
  EXPECT_NE(whole, start);
}

// Under the mode cpu::gemm adds left to right: 1e8 + 1 rounds back to 1e8 in f32, so the
// chain 1e8, +1, -1e8 gives 0 where another order could give 1; a 1 at the end survives.
TEST_F(FixedOrderGemmTest, TheModeMakesGemmAddLeftToRight) {
  const std::vector<float> a = {1e8f, 1.0f, -1e8f, 1e8f, -1e8f, 1.0f}, ones = {1, 1, 1};
  std::vector<float> c(2);
  set_batch_invariant(true);
  cpu::gemm<float>(false, false, 2, 1, 3, 1.0f, a.data(), 3, ones.data(), 1, 0.0f, c.data(), 1);
  set_batch_invariant(false);
  EXPECT_EQ(c, (std::vector<float>{0.0f, 1.0f}));
}

// Grouped products against per-group naive products. Group sizes include zeros, first
// and in the middle.
class GroupedMatmulTest : public ::testing::Test {
 protected:
  const std::vector<int32_t> sizes_ = {0, 5, 0, 3, 9};
  const int64_t groups_ = 5, rows_ = 17, n_ = 7, k_ = 11;
};

TEST_F(GroupedMatmulTest, ForwardAndBackwardMatchNaive) {
  const auto a_nt = random_vector<double>(rows_ * k_, 10);  // (R, K)
  const auto a_nn = random_vector<double>(rows_ * n_, 11);  // (R, N)
  const auto w = random_vector<double>(groups_ * n_ * k_, 12);
  std::vector<double> out_nt(rows_ * n_), out_nn(rows_ * k_);
  auto dw = random_vector<double>(groups_ * n_ * k_, 13);
  std::vector<double> expected_nt(rows_ * n_), expected_nn(rows_ * k_), expected_dw = dw;
  int64_t row = 0;
  for (int64_t g = 0; g < groups_; ++g) {
    const int64_t r = sizes_[g];
    const std::vector<double> wg(w.begin() + g * n_ * k_, w.begin() + (g + 1) * n_ * k_);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < n_; ++j) {
        for (int64_t p = 0; p < k_; ++p) {
          expected_nt[(row + i) * n_ + j] += a_nt[(row + i) * k_ + p] * wg[j * k_ + p];
          expected_nn[(row + i) * k_ + p] += a_nn[(row + i) * n_ + j] * wg[j * k_ + p];
          expected_dw[g * n_ * k_ + j * k_ + p] +=
              a_nn[(row + i) * n_ + j] * a_nt[(row + i) * k_ + p];
        }
      }
    }
    row += r;
  }
  cpu::grouped_matmul_nt<double>(a_nt.data(), w.data(), sizes_.data(), groups_, n_, k_,
                                 out_nt.data());
  cpu::grouped_matmul_nn<double>(a_nn.data(), w.data(), sizes_.data(), groups_, n_, k_,
                                 out_nn.data());
  cpu::grouped_matmul_tn_accumulate<double>(a_nn.data(), a_nt.data(), sizes_.data(), groups_, n_,
                                            k_, dw.data());
  EXPECT_LT(max_relative_error(out_nt, expected_nt), 1e-13);
  EXPECT_LT(max_relative_error(out_nn, expected_nn), 1e-13);
  EXPECT_LT(max_relative_error(dw, expected_dw), 1e-13);
  EXPECT_TRUE(any_nonzero(out_nt));
  EXPECT_TRUE(any_nonzero(out_nn));
}

// Sizes adding up to fewer than the rows (a buffer sized for the most rows a routing plan
// can keep): the rows past their sum are not written, and NaNs there are not read. More
// rows than the buffer has are refused.
TEST_F(GroupedMatmulTest, RowsPastTheGroupsAreNeitherReadNorWritten) {
  const int64_t spare = 4, rows = rows_ + spare;
  const float nan = std::nanf("");
  auto with_tail = [&](std::vector<float> v, int64_t cols, float tail) {
    v.resize(rows * cols, tail);
    return v;
  };
  const auto a_nt = random_vector<float>(rows_ * k_, 40),
             a_nn = random_vector<float>(rows_ * n_, 41);
  const auto w = random_vector<float>(groups_ * n_ * k_, 42);
  const auto dw0 = random_vector<float>(groups_ * n_ * k_, 43);
  const Tensor t_w = host_tensor<float>({groups_, n_, k_}, w), t_sizes = host_tensor<int32_t>(sizes_);
  // The exact buffers, then the same with a NaN tail in the operands and 7s in the outputs.
  Tensor want_nt = Tensor::empty({rows_, n_}), want_nn = Tensor::empty({rows_, k_});
  Tensor want_dw = host_tensor<float>({groups_, n_, k_}, dw0);
  grouped_matmul_nt(cpu_device(), host_tensor<float>({rows_, k_}, a_nt), t_w, t_sizes, want_nt);
  grouped_matmul_nn(cpu_device(), host_tensor<float>({rows_, n_}, a_nn), t_w, t_sizes, want_nn);
  grouped_matmul_tn_accumulate(cpu_device(), host_tensor<float>({rows_, n_}, a_nn),
                               host_tensor<float>({rows_, k_}, a_nt), t_sizes, want_dw);
  const Tensor tail_nt = host_tensor<float>({rows, k_}, with_tail(a_nt, k_, nan));
  const Tensor tail_nn = host_tensor<float>({rows, n_}, with_tail(a_nn, n_, nan));
  Tensor out_nt = host_tensor<float>({rows, n_}, std::vector<float>(rows * n_, 7.0f));
  Tensor out_nn = host_tensor<float>({rows, k_}, std::vector<float>(rows * k_, 7.0f));
  Tensor dw = host_tensor<float>({groups_, n_, k_}, dw0);
  grouped_matmul_nt(cpu_device(), tail_nt, t_w, t_sizes, out_nt);
  grouped_matmul_nn(cpu_device(), tail_nn, t_w, t_sizes, out_nn);
  grouped_matmul_tn_accumulate(cpu_device(), tail_nn, tail_nt, t_sizes, dw);
  EXPECT_EQ(values_of<float>(out_nt), with_tail(values_of<float>(want_nt), n_, 7.0f));
  EXPECT_EQ(values_of<float>(out_nn), with_tail(values_of<float>(want_nn), k_, 7.0f));
  EXPECT_EQ(values_of<float>(dw), values_of<float>(want_dw));

  // The CPU's products read host sizes where they are.
  EXPECT_EQ(group_sizes_for(cpu_device(), DType::kF32, t_sizes).raw_data(), t_sizes.raw_data());

  Tensor short_out = Tensor::empty({rows_ - 1, n_});
  EXPECT_DEATH(
      grouped_matmul_nt(cpu_device(), host_tensor<float>({rows_, k_}, a_nt).slice_rows(0, rows_ - 1), t_w,
                        t_sizes, short_out),
      "add up to more than the rows");
}

// bf16 operands run as the f32 product of their exact f32 values, rounded once into a
// bf16 result (f32 results are not rounded); a bf16 c is read for beta != 0.
TEST(GemmTest, Bf16OperandsComputeInF32) {
  const int64_t m = 5, n = 7, k = 300;
  const Tensor a32 = host_tensor<float>({m, k}, random_vector<float>(m * k, 1));
  const Tensor b32 = host_tensor<float>({k, n}, random_vector<float>(k * n, 2));
  Tensor a = Tensor::empty({m, k}, DType::kBF16), b = Tensor::empty({k, n}, DType::kBF16);
  convert(cpu_device(), a32, a);
  convert(cpu_device(), b32, b);
  Tensor expected = Tensor::empty({m, n});
  matmul(cpu_device(), widened(a), false, widened(b), false, expected);
  Tensor c32 = Tensor::empty({m, n});
  matmul(cpu_device(), a, false, b, false, c32);
  Tensor c16 = Tensor::empty({m, n}, DType::kBF16);
  matmul(cpu_device(), a, false, b, false, c16);
  for (int64_t i = 0; i < m * n; ++i) {
    EXPECT_EQ(c32.data<float>()[i], expected.data<float>()[i]);
    EXPECT_EQ(c16.data<bf16>()[i].bits, to_bf16(expected.data<float>()[i]).bits);
  }
  // c16 = a b - c16: exactly representable inputs, one rounding at the end.
  Tensor twice = Tensor::empty({m, n});
  for (int64_t i = 0; i < m * n; ++i)
    twice.data<float>()[i] = expected.data<float>()[i] - to_float(c16.data<bf16>()[i]);
  matmul(cpu_device(), a, false, b, false, c16, 1.0f, -1.0f);
  for (int64_t i = 0; i < m * n; ++i)
    EXPECT_EQ(c16.data<bf16>()[i].bits, to_bf16(twice.data<float>()[i]).bits);
  Tensor mixed = Tensor::empty({k, n});
  EXPECT_DEATH(matmul(cpu_device(), a, false, mixed, false, c32), "both f32 or both bf16");
  // f32 operands into a bf16 result: cuBLASLt has no such product, so neither backend
  // takes it.
  EXPECT_DEATH(matmul(cpu_device(), a32, false, b32, false, c16), "for bf16 operands");
}

}  // namespace
}  // namespace switchyard
