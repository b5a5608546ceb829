// CUDA rotary embedding against its CPU twin.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

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

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
