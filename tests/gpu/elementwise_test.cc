// CUDA elementwise ops against their CPU twins.
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::abs_of;
using testing::all_close;
using testing::sum_close;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;
using testing::to_host;

constexpr double kTol = 1e-5;

// `t` (f32) in `dtype`.
Tensor in_dtype(const Tensor& t, DType dtype) { return dtype == DType::kBF16 ? as_bf16(t) : t; }

// With bf16 operands both sides compute in f32 from the same bf16 values: a bf16 result
// may differ by one rounding (1/128 relative), an f32 one by the f32 arithmetic.
double tolerance(DType result) { return result == DType::kBF16 ? 1.0 / 128 : 1e-4; }

TEST(ElementwiseGpu, AddAndScaleMatchCpu) {
  CudaDevice gpu(0);
  // The large size runs past one grid of blocks, through the grid-stride loop.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000003}, (int64_t{1} << 24) + 4099}) {
    SCOPED_TRACE(n);
    Tensor y = random_tensor({n}, 1);
    const Tensor x = random_tensor({n}, 2);
    Tensor gy = to_device(gpu, y);
    add_(gpu, gy, to_device(gpu, x), 0.37f);
    add_(cpu_device(), y, x, 0.37f);
    EXPECT_TRUE(all_close(gy, y, kTol));
    scale_(gpu, gy, -1.7f);
    scale_(cpu_device(), y, -1.7f);
    EXPECT_TRUE(all_close(gy, y, kTol));
  }
}

TEST(ElementwiseGpu, BiasAndItsGradientMatchCpu) {
  CudaDevice gpu(0);
  // Row counts around the column-sum chunking: one row, a partial chunk, many chunks.
  for (int64_t rows : {0, 1, 33, 1000, 70001}) {
    SCOPED_TRACE(rows);
    const int64_t n = 77;
    Tensor y = random_tensor({rows, n}, 3);
    const Tensor bias = random_tensor({n}, 4);
    Tensor gy = to_device(gpu, y);
    add_bias_(gpu, gy, to_device(gpu, bias));
    add_bias_(cpu_device(), y, bias);
    EXPECT_TRUE(all_close(gy, y, kTol));

    Tensor dbias = random_tensor({n}, 5);
    Tensor gdbias = to_device(gpu, dbias);
    Tensor magnitudes = abs_of(dbias);
    bias_backward(gpu, to_device(gpu, y), gdbias);
    bias_backward(cpu_device(), y, dbias);
    bias_backward(cpu_device(), abs_of(y), magnitudes);
    EXPECT_TRUE(sum_close(gdbias, dbias, magnitudes, kTol));
  }
}

TEST(ElementwiseGpu, SumSquaresMatchesCpu) {
  CudaDevice gpu(0);
  for (int64_t n : {0, 1, 257, 5000011}) {
    SCOPED_TRACE(n);
    const Tensor x = random_tensor({n}, 6, -3.0, 3.0);
    const double cpu = sum_squares(cpu_device(), x);
    const double gpu_value = sum_squares(gpu, to_device(gpu, x));
    EXPECT_NEAR(gpu_value, cpu, 1e-12 * std::max(1.0, cpu));
    if (n > 0) {
      EXPECT_GT(gpu_value, 0.0);
    }
  }
}

TEST(ElementwiseGpu, SumSquaresOfManyTensorsMatchCpu) {
  CudaDevice gpu(0);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<Tensor> xs, gxs;
    int seed = 20;
    for (int64_t n : {257, 0, 1, 1000003, 64}) {
      const Tensor x = random_tensor({n}, ++seed, -2.0, 2.0);
      xs.push_back(dtype == DType::kBF16 ? as_bf16(x) : x);
      gxs.push_back(to_device(gpu, xs.back()));
    }
    const std::vector<double> cpu = sum_squares(cpu_device(), xs);
    const std::vector<double> got = sum_squares(gpu, gxs);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_NEAR(got[i], cpu[i], 1e-12 * std::max(1.0, cpu[i])) << i;
      // The same kernels as for the tensor alone.
      EXPECT_EQ(got[i], sum_squares(gpu, gxs[i])) << i;
    }
    EXPECT_EQ(got[1], 0.0);
  }
}

TEST(ElementwiseGpu, SigmoidGateMatchesCpu) {
  CudaDevice gpu(0);
  for (int64_t rows : {0, 1, 37, 300}) {
    SCOPED_TRACE(rows);
    const int64_t n = 129;
    const Tensor x = random_tensor({rows, n}, 7);
    const Tensor g = random_tensor({rows, 1}, 8, -6.0, 6.0);
    Tensor y = random_tensor({rows, n}, 9);
    Tensor gy = to_device(gpu, y);
    sigmoid_gate_forward(gpu, to_device(gpu, x), to_device(gpu, g), gy);
    sigmoid_gate_forward(cpu_device(), x, g, y);
    EXPECT_TRUE(all_close(gy, y, kTol));

    const Tensor dy = random_tensor({rows, n}, 10);
    Tensor dx = Tensor::empty({rows, n}), dg = Tensor::empty({rows, 1});
    sigmoid_gate_backward(cpu_device(), dy, x, g, dx, dg);
    Tensor gdx = testing::poisoned(gpu, {rows, n}), gdg = testing::poisoned(gpu, {rows, 1});
    sigmoid_gate_backward(gpu, to_device(gpu, dy), to_device(gpu, x), to_device(gpu, g), gdx, gdg);
    EXPECT_TRUE(all_close(gdx, dx, kTol));
    EXPECT_TRUE(all_close(gdg, dg, kTol));
  }
}

TEST(ElementwiseGpu, Bf16AddScaleAndSumSquaresMatchCpu) {
  CudaDevice gpu(0);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000003}, (int64_t{1} << 24) + 4099}) {
    SCOPED_TRACE(n);
    Tensor y = as_bf16(random_tensor({n}, 13));
    const Tensor x = as_bf16(random_tensor({n}, 14, -3.0, 3.0));
    Tensor gy = to_device(gpu, y);
    add_(gpu, gy, to_device(gpu, x), 0.37f);
    add_(cpu_device(), y, x, 0.37f);
    EXPECT_TRUE(all_close(gy, y, tolerance(DType::kBF16)));
    gy = to_device(gpu, y);  // the same bf16 inputs on both sides
    scale_(gpu, gy, -1.7f);
    scale_(cpu_device(), y, -1.7f);
    EXPECT_TRUE(all_close(gy, y, tolerance(DType::kBF16)));
    const double cpu = sum_squares(cpu_device(), x);
    EXPECT_NEAR(sum_squares(gpu, to_device(gpu, x)), cpu, 1e-12 * std::max(1.0, cpu));
  }
}

TEST(ElementwiseGpu, Bf16BiasAndSigmoidGateMatchCpu) {
  CudaDevice gpu(0);
  for (DType y_type : {DType::kF32, DType::kBF16}) {
    for (DType g_type : {DType::kF32, DType::kBF16}) {
      if (y_type == DType::kF32 && g_type == DType::kF32) continue;
      for (int64_t rows : {0, 1, 33, 1000, 70001}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(y_type) << " rows, " << dtype_name(g_type)
                                          << " bias and gate, " << rows << " rows");
        const int64_t n = 77;
        Tensor y = in_dtype(random_tensor({rows, n}, 15), y_type);
        const Tensor bias = in_dtype(random_tensor({n}, 16), g_type);
        Tensor gy = to_device(gpu, y);
        add_bias_(gpu, gy, to_device(gpu, bias));
        add_bias_(cpu_device(), y, bias);
        EXPECT_TRUE(all_close(gy, y, tolerance(y_type)));

        // dbias stays f32 whatever dy is.
        Tensor dbias = random_tensor({n}, 17);
        Tensor gdbias = to_device(gpu, dbias);
        Tensor magnitudes = abs_of(dbias);
        bias_backward(gpu, to_device(gpu, y), gdbias);
        bias_backward(cpu_device(), y, dbias);
        bias_backward(cpu_device(), abs_of(y), magnitudes);
        EXPECT_TRUE(sum_close(gdbias, dbias, magnitudes, tolerance(DType::kF32)));

        const Tensor x = in_dtype(random_tensor({rows, n}, 18), y_type);
        const Tensor g = in_dtype(random_tensor({rows, 1}, 19, -6.0, 6.0), g_type);
        gy = to_device(gpu, y);
        sigmoid_gate_forward(gpu, to_device(gpu, x), to_device(gpu, g), gy);
        sigmoid_gate_forward(cpu_device(), x, g, y);
        EXPECT_TRUE(all_close(gy, y, tolerance(y_type)));

        const Tensor dy = in_dtype(random_tensor({rows, n}, 20), y_type);
        Tensor dx = Tensor::empty({rows, n}, y_type), dg = Tensor::empty({rows, 1}, g_type);
        sigmoid_gate_backward(cpu_device(), dy, x, g, dx, dg);
        Tensor gdx = poisoned(gpu, {rows, n}, y_type), gdg = poisoned(gpu, {rows, 1}, g_type);
        sigmoid_gate_backward(gpu, to_device(gpu, dy), to_device(gpu, x), to_device(gpu, g), gdx,
                              gdg);
        EXPECT_TRUE(all_close(gdx, dx, tolerance(y_type)));
        EXPECT_TRUE(all_close(gdg, dg, tolerance(g_type)));
      }
    }
  }
}

TEST(ElementwiseGpuDeathTest, RejectsTensorsOffTheDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the parent holds a CUDA context
  CudaDevice gpu(0);
  Tensor y = random_tensor({8}, 11);
  const Tensor x = random_tensor({8}, 12);
  EXPECT_DEATH(add_(gpu, y, x), "not on the op's device");
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
