// CUDA routing statistics and aux-loss gradient against their CPU twins.
#include "kernels/router_aux.h"

#include <gtest/gtest.h>

#include "engine/runtime/rng.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::host_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

// Expert ids in [-1, E): -1 marks an unsent assignment, which counts for no expert.
Tensor expert_ids(int64_t n, int64_t k, int64_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(experts + 1)) - 1;
  return host_tensor({n, k}, ids);
}

TEST(RouterAuxGpu, RoutingCountsAndAuxGradientMatchCpu) {
  CudaDevice gpu(0);
  for (int64_t n : {0, 1, 1000, 30000}) {
    SCOPED_TRACE(n);
    const int64_t experts = 13, k = 3;
    const Tensor probs = random_tensor({n, experts}, 1, 0.0, 1.0);
    const Tensor ids = expert_ids(n, k, experts, 2);
    const Tensor gprobs = to_device(gpu, probs);
    Tensor selections = Tensor::empty({experts}), prob_sums = Tensor::empty({experts});
    routing_counts(cpu_device(), probs, ids, selections, prob_sums);
    Tensor gselections = poisoned(gpu, {experts}), gprob_sums = poisoned(gpu, {experts});
    routing_counts(gpu, gprobs, to_device(gpu, ids), gselections, gprob_sums);
    EXPECT_TRUE(all_equal(gselections, selections));
    EXPECT_TRUE(all_close(gprob_sums, prob_sums, 1e-6));

    const Tensor prob_grad = random_tensor({experts}, 3);
    Tensor dlogits = random_tensor({n, experts}, 4);  // accumulated into
    Tensor gdlogits = to_device(gpu, dlogits);
    aux_loss_backward(gpu, gprobs, to_device(gpu, prob_grad), gdlogits);
    aux_loss_backward(cpu_device(), probs, prob_grad, dlogits);
    EXPECT_TRUE(all_close(gdlogits, dlogits, 1e-5));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
