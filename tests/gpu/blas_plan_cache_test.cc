// The CUDA device's cache of cuBLASLt plans (cuda::Blas), which has no CPU twin; the
// products themselves are in the op table (tests/ops/op_table.h, entry "matmul").
#include <gtest/gtest.h>

#include "kernels/cuda/gemm.h"
#include "kernels/gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_equal;
using testing::integer_tensor;
using testing::poisoned;
using testing::to_device;

// Every new product shape makes a cuBLASLt plan; the cache of them stays bounded (f32
// expert products bring a new row count every step) and products stay right past it.
TEST(BlasPlanCacheGpu, StaysBounded) {
  CudaDevice gpu(0);
  const int64_t rows = static_cast<int64_t>(cuda::Blas::kMaxPlans) + 10, n = 8, k = 16;
  const Tensor a = integer_tensor({rows, k}, 1, -4, 4), b = integer_tensor({k, n}, 2, -4, 4);
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
