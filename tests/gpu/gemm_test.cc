// CUDA matrix products (cuBLAS) against their CPU twins (OpenBLAS). Integer-valued inputs
// make every product exact on both, so those cases demand equality.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kernels/convert.h"
#include "kernels/cuda/gemm.h"
#include "kernels/elementwise.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_close;
using testing::all_equal;
using testing::any_nonzero;
using testing::host_tensor;
using testing::integer_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

constexpr double kTol = 1e-5;

// Integer values in [-4, 4], or uniform floats.
Tensor operand(const Shape& shape, uint64_t seed, bool integers) {
  return integers ? integer_tensor(shape, seed, -4, 4) : random_tensor(shape, seed);
}

::testing::AssertionResult matches(const Tensor& gpu, const Tensor& cpu, bool integers) {
  return integers ? all_equal(gpu, cpu) : all_close(gpu, cpu, kTol);
}

TEST(GemmGpu, MatmulMatchesCpuForEveryTransposition) {
  CudaDevice gpu(0);
  const int64_t m = 37, n = 65, k = 129;
  for (bool integers : {true, false}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "integers " << integers << " trans_a " << trans_a
                                          << " trans_b " << trans_b);
        const Tensor a = operand(trans_a ? Shape{k, m} : Shape{m, k}, 1, integers);
        const Tensor b = operand(trans_b ? Shape{n, k} : Shape{k, n}, 2, integers);
        const Tensor ga = to_device(gpu, a), gb = to_device(gpu, b);
        // beta = 0 writes over the poison; beta != 0 reads c.
        Tensor c = Tensor::empty({m, n});
        matmul(cpu_device(), a, trans_a, b, trans_b, c);
        Tensor gc = poisoned(gpu, {m, n});
        matmul(gpu, ga, trans_a, gb, trans_b, gc);
        EXPECT_TRUE(matches(gc, c, integers));
        EXPECT_TRUE(any_nonzero(c));

        Tensor acc = operand({m, n}, 3, integers);
        Tensor gacc = to_device(gpu, acc);
        matmul(gpu, ga, trans_a, gb, trans_b, gacc, 2.0f, -1.0f);
        matmul(cpu_device(), a, trans_a, b, trans_b, acc, 2.0f, -1.0f);
        EXPECT_TRUE(matches(gacc, acc, integers));
      }
    }
  }
}

TEST(GemmGpu, MatmulReadsHigherRankOperandsAsMatrices) {
  CudaDevice gpu(0);
  const Tensor x = random_tensor({2, 19, 33}, 4);  // (2 x 19, 33)
  const Tensor w = random_tensor({17, 33}, 5);
  Tensor y = Tensor::empty({2, 19, 17});
  matmul(cpu_device(), x, false, w, true, y);
  Tensor gy = poisoned(gpu, {2, 19, 17});
  matmul(gpu, to_device(gpu, x), false, to_device(gpu, w), true, gy);
  EXPECT_TRUE(all_close(gy, y, kTol));
}

TEST(GemmGpu, EmptyInnerDimensionScalesC) {
  CudaDevice gpu(0);
  const Tensor a = Tensor::empty({5, 0}), b = Tensor::empty({0, 7});
  Tensor gc = poisoned(gpu, {5, 7});
  matmul(gpu, to_device(gpu, a), false, to_device(gpu, b), false, gc);
  EXPECT_TRUE(all_equal(gc, host_tensor({5, 7}, std::vector<float>(35, 0.0f))));

  Tensor c = integer_tensor({5, 7}, 6, -4, 4);
  Tensor gscaled = to_device(gpu, c);
  matmul(gpu, to_device(gpu, a), false, to_device(gpu, b), false, gscaled, 1.0f, 3.0f);
  matmul(cpu_device(), a, false, b, false, c, 1.0f, 3.0f);
  EXPECT_TRUE(all_equal(gscaled, c));
}

// Group sizes with empty groups first, inside and last; and all groups empty.
std::vector<std::vector<int32_t>> group_cases() {
  return {{0, 5, 0, 37, 1, 33, 0}, {64}, {0, 0, 0}};
}

TEST(GemmGpu, GroupedProductsMatchCpu) {
  CudaDevice gpu(0);
  const int64_t n = 65, k = 129;
  for (bool integers : {true, false}) {
    for (const std::vector<int32_t>& sizes : group_cases()) {
      const int64_t groups = static_cast<int64_t>(sizes.size());
      const int64_t rows = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
      SCOPED_TRACE(::testing::Message()
                   << "integers " << integers << ", " << groups << " groups, " << rows << " rows");
      const Tensor group_sizes = host_tensor({groups}, sizes);  // host memory on every device

      const Tensor a_k = operand({rows, k}, 7, integers);
      const Tensor w = operand({groups, n, k}, 8, integers);
      const Tensor gw = to_device(gpu, w);
      Tensor out_n = Tensor::empty({rows, n});
      grouped_matmul_nt(cpu_device(), a_k, w, group_sizes, out_n);
      Tensor gout_n = poisoned(gpu, {rows, n});
      grouped_matmul_nt(gpu, to_device(gpu, a_k), gw, group_sizes, gout_n);
      EXPECT_TRUE(matches(gout_n, out_n, integers));

      const Tensor a_n = operand({rows, n}, 9, integers);
      Tensor out_k = Tensor::empty({rows, k});
      grouped_matmul_nn(cpu_device(), a_n, w, group_sizes, out_k);
      Tensor gout_k = poisoned(gpu, {rows, k});
      grouped_matmul_nn(gpu, to_device(gpu, a_n), gw, group_sizes, gout_k);
      EXPECT_TRUE(matches(gout_k, out_k, integers));

      const Tensor b_k = operand({rows, k}, 10, integers);
      Tensor dw = operand({groups, n, k}, 11, integers);  // accumulated into
      Tensor gdw = to_device(gpu, dw);
      grouped_matmul_tn_accumulate(gpu, to_device(gpu, a_n), to_device(gpu, b_k), group_sizes, gdw);
      grouped_matmul_tn_accumulate(cpu_device(), a_n, b_k, group_sizes, dw);
      EXPECT_TRUE(matches(gdw, dw, integers));
    }
  }
}

// bf16 operands with f32 and bf16 results, against the CPU (which computes on the
// widened operands): integer inputs are exact in bf16 and their products exact in f32,
// so those results agree to the bit, the bf16 ones after the same final rounding.
TEST(GemmGpu, Bf16OperandsMatchCpu) {
  CudaDevice gpu(0);
  const int64_t m = 37, n = 65, k = 129;
  for (bool integers : {true, false}) {
    for (DType result : {DType::kF32, DType::kBF16}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "integers " << integers << " result "
                                          << dtype_name(result) << " trans_b " << trans_b);
        const Tensor a = as_bf16(operand({m, k}, 1, integers));
        const Tensor b = as_bf16(operand(trans_b ? Shape{n, k} : Shape{k, n}, 2, integers));
        Tensor c = Tensor::empty({m, n}, result);
        matmul(cpu_device(), a, false, b, trans_b, c);
        Tensor gc = poisoned(gpu, {m, n}, result);
        matmul(gpu, to_device(gpu, a), false, to_device(gpu, b), trans_b, gc);
        const double tol = result == DType::kBF16 ? 1.0 / 128 : kTol;
        EXPECT_TRUE(integers ? all_equal(gc, c) : all_close(gc, c, tol));
      }
    }
  }
  // Grouped: bf16 activations and weights, f32 weight gradients accumulated.
  const std::vector<int32_t> sizes = {5, 0, 17, 1};
  const Tensor group_sizes = host_tensor({4}, sizes);
  const Tensor x = as_bf16(operand({23, k}, 3, true));
  const Tensor w = as_bf16(operand({4, n, k}, 4, true));
  Tensor out = Tensor::empty({23, n}, DType::kBF16);
  grouped_matmul_nt(cpu_device(), x, w, group_sizes, out);
  Tensor gout = poisoned(gpu, {23, n}, DType::kBF16);
  grouped_matmul_nt(gpu, to_device(gpu, x), to_device(gpu, w), group_sizes, gout);
  EXPECT_TRUE(all_equal(gout, out));
  const Tensor dy = as_bf16(operand({23, n}, 5, true));
  Tensor dw = operand({4, n, k}, 6, true);
  Tensor gdw = to_device(gpu, dw);
  grouped_matmul_tn_accumulate(cpu_device(), dy, x, group_sizes, dw);
  grouped_matmul_tn_accumulate(gpu, to_device(gpu, dy), to_device(gpu, x), group_sizes, gdw);
  EXPECT_TRUE(all_equal(gdw, dw));
}

// Accumulating into a bf16 result rounds once, from f32, as on the CPU: c starts at minus
// the rounded product, so the sum cancels to the product's own rounding residue, which a
// product rounded to bf16 before the sum (cuBLASLt's bf16 beta path) loses entirely.
TEST(GemmGpu, Bf16AccumulationRoundsOnce) {
  CudaDevice gpu(0);
  const int64_t m = 37, n = 65, k = 129;
  const Tensor a = as_bf16(operand({m, k}, 7, false));
  const Tensor b = as_bf16(operand({k, n}, 8, false));
  Tensor c = Tensor::empty({m, n}, DType::kBF16);
  matmul(cpu_device(), a, false, b, false, c);
  scale_(cpu_device(), c, -1.0f);
  Tensor gc = to_device(gpu, c);
  matmul(cpu_device(), a, false, b, false, c, 1.0f, 1.0f);
  matmul(gpu, to_device(gpu, a), false, to_device(gpu, b), false, gc, 1.0f, 1.0f);
  EXPECT_TRUE(any_nonzero(c));
  EXPECT_TRUE(all_close(gc, c, 1e-3));
}

// Every new product shape makes a cuBLASLt plan; the cache of them stays bounded (f32
// expert products bring a new row count every step) and products stay right past it.
TEST(GemmGpu, PlanCacheStaysBounded) {
  CudaDevice gpu(0);
  const int64_t rows = static_cast<int64_t>(cuda::Blas::kMaxPlans) + 10, n = 8, k = 16;
  const Tensor a = operand({rows, k}, 1, true), b = operand({k, n}, 2, true);
  const Tensor ga = to_device(gpu, a), gb = to_device(gpu, b);
  for (int64_t m = 1; m <= rows; ++m) {
    Tensor gc = poisoned(gpu, {m, n});
    matmul(gpu, ga.slice_rows(0, m), false, gb, false, gc);
    EXPECT_LE(gpu.blas().cached_plans(), cuda::Blas::kMaxPlans);
    if (m < rows) continue;
    Tensor c = Tensor::empty({m, n});
    matmul(cpu_device(), a, false, b, false, c);
    EXPECT_TRUE(all_equal(gc, c));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
