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

// The multi-tensor step in one launch (tensors spanning several 64K chunks, an empty
// one, one without weight decay) with bf16 working copies, against the CPU.
TEST(AdamWGpu, MultiTensorStepMatchesCpu) {
  CudaDevice gpu(0);
  const std::vector<int64_t> sizes = {200001, 0, 7, 65536};
  std::vector<Tensor> param, grad, m, v, work, gparam, ggrad, gm, gv, gwork;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    param.push_back(random_tensor({n}, 10 * t + 1));
    grad.push_back(random_tensor({n}, 10 * t + 2, -2.0, 2.0));
    m.push_back(random_tensor({n}, 10 * t + 3, -0.1, 0.1));
    v.push_back(random_tensor({n}, 10 * t + 4, 0.01, 0.2));
    work.push_back(Tensor::empty({n}, DType::kBF16));
    gparam.push_back(to_device(gpu, param[t]));
    ggrad.push_back(to_device(gpu, grad[t]));
    gm.push_back(to_device(gpu, m[t]));
    gv.push_back(to_device(gpu, v[t]));
    gwork.push_back(testing::poisoned(gpu, {n}, DType::kBF16));
  }
  auto updates = [&](std::vector<Tensor>& p, std::vector<Tensor>& g, std::vector<Tensor>& a,
                     std::vector<Tensor>& b, std::vector<Tensor>& w) {
    std::vector<AdamWUpdate> u;
    for (size_t t = 0; t < sizes.size(); ++t)
      u.push_back(AdamWUpdate{&p[t], &g[t], &a[t], &b[t], t != 2, &w[t]});
    return u;
  };
  const AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4};
  adamw_step(gpu, h, 0.5f, updates(gparam, ggrad, gm, gv, gwork));
  adamw_step(cpu_device(), h, 0.5f, updates(param, grad, m, v, work));
  for (size_t t = 0; t < sizes.size(); ++t) {
    SCOPED_TRACE(t);
    EXPECT_TRUE(all_close(gparam[t], param[t], 1e-5));
    EXPECT_TRUE(all_close(gm[t], m[t], 1e-5));
    EXPECT_TRUE(all_close(gv[t], v[t], 1e-5));
    // Rounded from values that agree to 1e-5: the bf16 copies agree to one bf16 step.
    EXPECT_TRUE(all_close(gwork[t], work[t], 1.0 / 128));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
