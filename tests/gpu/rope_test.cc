// CUDA rotary embedding against its CPU twin.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_close;
using testing::random_tensor;
using testing::to_device;

TEST(RopeGpu, ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  // (batch, seq, heads, head_dim); the table covers more positions than the sequence.
  for (const Shape& shape :
       {Shape{2, 37, 3, 66}, Shape{1, 5, 1, 2}, Shape{3, 129, 4, 128}, Shape{0, 4, 2, 8}}) {
    SCOPED_TRACE(shape_string(shape));
    const Tensor table = rope_table(shape[1] + 3, shape[3], 10000.0f);
    const Tensor gtable = to_device(gpu, table);
    Tensor x = random_tensor(shape, 1);
    Tensor gx = to_device(gpu, x);
    rope_forward(gpu, gtable, gx);
    rope_forward(cpu_device(), table, x);
    EXPECT_TRUE(all_close(gx, x, 1e-5));
    rope_backward(gpu, gtable, gx);
    rope_backward(cpu_device(), table, x);
    EXPECT_TRUE(all_close(gx, x, 1e-5));
  }
}

// A bf16 x with the f32 table: both sides rotate in f32 from the same bf16 values, so they
// agree to within one rounding; the backward starts again from the CPU's values.
TEST(RopeGpu, Bf16ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  const double tol = 1.0 / 128;
  for (const Shape& shape :
       {Shape{2, 37, 3, 66}, Shape{1, 5, 1, 2}, Shape{3, 129, 4, 128}, Shape{0, 4, 2, 8}}) {
    SCOPED_TRACE(shape_string(shape));
    const Tensor table = rope_table(shape[1] + 3, shape[3], 10000.0f);
    const Tensor gtable = to_device(gpu, table);
    Tensor x = as_bf16(random_tensor(shape, 2));
    Tensor gx = to_device(gpu, x);
    rope_forward(gpu, gtable, gx);
    rope_forward(cpu_device(), table, x);
    EXPECT_TRUE(all_close(gx, x, tol));
    gx = to_device(gpu, x);
    rope_backward(gpu, gtable, gx);
    rope_backward(cpu_device(), table, x);
    EXPECT_TRUE(all_close(gx, x, tol));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
