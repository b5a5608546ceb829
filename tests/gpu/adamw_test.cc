// CUDA AdamW step against its CPU twin.
#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::to_device;

TEST(AdamWGpu, StepsMatchCpu) {
  CudaDevice gpu(0);
  for (int64_t n : {0, 1, 100003}) {
    SCOPED_TRACE(n);
    Tensor param = random_tensor({n}, 1);
    Tensor exp_avg = random_tensor({n}, 2, -0.1, 0.1);
    Tensor exp_avg_sq = random_tensor({n}, 3, 0.01, 0.2);
    Tensor gparam = to_device(gpu, param), gexp_avg = to_device(gpu, exp_avg),
           gexp_avg_sq = to_device(gpu, exp_avg_sq);
    // Several steps, so the bias corrections change and errors would compound.
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = random_tensor({n}, 10 + step, -2.0, 2.0);
      const AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
      adamw_step(gpu, h, 0.5f, gparam, to_device(gpu, grad), gexp_avg, gexp_avg_sq);
      adamw_step(cpu_device(), h, 0.5f, param, grad, exp_avg, exp_avg_sq);
    }
    EXPECT_TRUE(all_close(gparam, param, 1e-5));
    EXPECT_TRUE(all_close(gexp_avg, exp_avg, 1e-5));
    EXPECT_TRUE(all_close(gexp_avg_sq, exp_avg_sq, 1e-5));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
