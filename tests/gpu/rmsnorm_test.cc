// CUDA RMSNorm against its CPU twin.
#include "kernels/rmsnorm.h"

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

constexpr double kTol = 1e-5;

// `t` (f32) in `dtype`.
Tensor in_dtype(const Tensor& t, DType dtype) { return dtype == DType::kBF16 ? as_bf16(t) : t; }

struct Case {
  int64_t rows;
  int64_t dim;
};

// The weight gradient's bound for sum_close: the same column sums over |dy| and |x|
// (rstd is positive), starting from |dweight|, which the gradient is accumulated into.
Tensor dweight_magnitudes(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& rstd, const Case& c, const Tensor& dweight) {
  Tensor magnitudes = abs_of(dweight);
  Tensor dx = Tensor::empty({c.rows, c.dim});
  rmsnorm_backward(cpu_device(), abs_of(dy), abs_of(x), weight, rstd, dx, magnitudes);
  return magnitudes;
}

TEST(RmsnormGpu, ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  // Dims below, above and far above the block size; more rows than one grid of blocks;
  // no rows at all.
  for (const Case c : {Case{67, 300}, Case{3, 4099}, Case{1, 1}, Case{70001, 8}, Case{0, 16}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " x " << c.dim);
    const Tensor x = random_tensor({c.rows, c.dim}, 1, -2.0, 2.0);
    const Tensor weight = random_tensor({c.dim}, 2, 0.5, 1.5);
    const float eps = 1e-6f;
    Tensor y = Tensor::empty({c.rows, c.dim}), rstd = Tensor::empty({c.rows});
    rmsnorm_forward(cpu_device(), x, weight, eps, y, rstd);
    Tensor gy = poisoned(gpu, {c.rows, c.dim}), grstd = poisoned(gpu, {c.rows});
    rmsnorm_forward(gpu, to_device(gpu, x), to_device(gpu, weight), eps, gy, grstd);
    EXPECT_TRUE(all_close(gy, y, kTol));
    EXPECT_TRUE(all_close(grstd, rstd, kTol));

    const Tensor dy = random_tensor({c.rows, c.dim}, 3);
    Tensor dx = Tensor::empty({c.rows, c.dim});
    Tensor dweight = random_tensor({c.dim}, 4);  // accumulated into
    Tensor gdx = poisoned(gpu, {c.rows, c.dim});
    Tensor gdweight = to_device(gpu, dweight);
    rmsnorm_backward(gpu, to_device(gpu, dy), to_device(gpu, x), to_device(gpu, weight),
                     to_device(gpu, rstd), gdx, gdweight);
    const Tensor magnitudes = dweight_magnitudes(dy, x, weight, rstd, c, dweight);
    rmsnorm_backward(cpu_device(), dy, x, weight, rstd, dx, dweight);
    EXPECT_TRUE(all_close(gdx, dx, kTol));
    EXPECT_TRUE(sum_close(gdweight, dweight, magnitudes, kTol));
  }
}

// bf16 activations and/or weight: both sides compute in f32 from the same bf16 values, so
// bf16 outputs agree to within one rounding (1/128 relative) and the f32 rstd and dweight
// closely.
TEST(RmsnormGpu, Bf16ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  for (DType x_type : {DType::kF32, DType::kBF16}) {
    for (DType w_type : {DType::kF32, DType::kBF16}) {
      if (x_type == DType::kF32 && w_type == DType::kF32) continue;
      const double tol = x_type == DType::kBF16 ? 1.0 / 128 : 1e-4;
      for (const Case c : {Case{67, 300}, Case{3, 4099}, Case{1, 1}, Case{70001, 8}, Case{0, 16}}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(x_type) << " activations, " << dtype_name(w_type) << " weight, "
                     << c.rows << " x " << c.dim);
        const Tensor x = in_dtype(random_tensor({c.rows, c.dim}, 5, -2.0, 2.0), x_type);
        const Tensor weight = in_dtype(random_tensor({c.dim}, 6, 0.5, 1.5), w_type);
        const float eps = 1e-6f;
        Tensor y = Tensor::empty({c.rows, c.dim}, x_type), rstd = Tensor::empty({c.rows});
        rmsnorm_forward(cpu_device(), x, weight, eps, y, rstd);
        Tensor gy = poisoned(gpu, {c.rows, c.dim}, x_type), grstd = poisoned(gpu, {c.rows});
        rmsnorm_forward(gpu, to_device(gpu, x), to_device(gpu, weight), eps, gy, grstd);
        EXPECT_TRUE(all_close(gy, y, tol));
        EXPECT_TRUE(all_close(grstd, rstd, 1e-4));

        const Tensor dy = in_dtype(random_tensor({c.rows, c.dim}, 7), x_type);
        Tensor dx = Tensor::empty({c.rows, c.dim}, x_type);
        Tensor dweight = random_tensor({c.dim}, 8);  // f32, accumulated into
        Tensor gdx = poisoned(gpu, {c.rows, c.dim}, x_type);
        Tensor gdweight = to_device(gpu, dweight);
        rmsnorm_backward(gpu, to_device(gpu, dy), to_device(gpu, x), to_device(gpu, weight),
                         to_device(gpu, rstd), gdx, gdweight);
        const Tensor magnitudes = dweight_magnitudes(dy, x, weight, rstd, c, dweight);
        rmsnorm_backward(cpu_device(), dy, x, weight, rstd, dx, dweight);
        EXPECT_TRUE(all_close(gdx, dx, tol));
        EXPECT_TRUE(sum_close(gdweight, dweight, magnitudes, 1e-4));
      }
    }
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
