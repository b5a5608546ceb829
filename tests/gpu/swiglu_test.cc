// CUDA SwiGLU against its CPU twin.
#include "kernels/swiglu.h"

#include <gtest/gtest.h>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_close;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

TEST(SwigluGpu, ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  for (int64_t rows : {0, 1, 37, 1000}) {
    SCOPED_TRACE(rows);
    const int64_t inter = 129;
    const Tensor gate_up = random_tensor({rows, 2 * inter}, 1, -8.0, 8.0);
    Tensor out = Tensor::empty({rows, inter});
    swiglu_forward(cpu_device(), gate_up, out);
    Tensor gout = poisoned(gpu, {rows, inter});
    swiglu_forward(gpu, to_device(gpu, gate_up), gout);
    EXPECT_TRUE(all_close(gout, out, 1e-5));

    const Tensor dout = random_tensor({rows, inter}, 2);
    Tensor dgate_up = Tensor::empty({rows, 2 * inter});
    swiglu_backward(cpu_device(), dout, gate_up, dgate_up);
    Tensor gdgate_up = poisoned(gpu, {rows, 2 * inter});
    swiglu_backward(gpu, to_device(gpu, dout), to_device(gpu, gate_up), gdgate_up);
    EXPECT_TRUE(all_close(gdgate_up, dgate_up, 1e-5));
  }
}

// bf16 operands: both sides compute in f32 from the same bf16 values, so the bf16 results
// agree to within one rounding.
TEST(SwigluGpu, Bf16ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  const double tol = 1.0 / 128;
  for (int64_t rows : {0, 1, 37, 1000}) {
    SCOPED_TRACE(rows);
    const int64_t inter = 129;
    const Tensor gate_up = as_bf16(random_tensor({rows, 2 * inter}, 3, -8.0, 8.0));
    Tensor out = Tensor::empty({rows, inter}, DType::kBF16);
    swiglu_forward(cpu_device(), gate_up, out);
    Tensor gout = poisoned(gpu, {rows, inter}, DType::kBF16);
    swiglu_forward(gpu, to_device(gpu, gate_up), gout);
    EXPECT_TRUE(all_close(gout, out, tol));

    const Tensor dout = as_bf16(random_tensor({rows, inter}, 4));
    Tensor dgate_up = Tensor::empty({rows, 2 * inter}, DType::kBF16);
    swiglu_backward(cpu_device(), dout, gate_up, dgate_up);
    Tensor gdgate_up = poisoned(gpu, {rows, 2 * inter}, DType::kBF16);
    swiglu_backward(gpu, to_device(gpu, dout), to_device(gpu, gate_up), gdgate_up);
    EXPECT_TRUE(all_close(gdgate_up, dgate_up, tol));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
