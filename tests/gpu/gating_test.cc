// CUDA router gating and z-loss against their CPU twins.
#include "kernels/gating.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

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

constexpr double kTol = 1e-5;

// Logits whose probabilities are far apart within a row (a shuffled ladder with steps of
// 0.37 plus small noise), so rounding differences between the backends cannot reorder
// the top k; then exact ties: row 0 all equal, row 1 two equal maxima.
Tensor router_logits(int64_t n, int64_t num_experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> logits(n * num_experts);
  std::vector<int> ladder(num_experts);
  for (int64_t r = 0; r < n; ++r) {
    std::iota(ladder.begin(), ladder.end(), 0);
    for (int64_t e = num_experts - 1; e > 0; --e) std::swap(ladder[e], ladder[rng.below(e + 1)]);
    for (int64_t e = 0; e < num_experts; ++e)
      logits[r * num_experts + e] =
          static_cast<float>(0.37 * ladder[e] - 2.0 + 0.01 * rng.uniform());
  }
  if (n > 0) std::fill(logits.begin(), logits.begin() + num_experts, 0.5f);
  if (n > 1 && num_experts > 2) {
    float* row = logits.data() + num_experts;
    for (int64_t e = 0; e < num_experts; ++e) row[e] = -1.0f - 0.1f * static_cast<float>(e);
    row[num_experts - 1] = row[1] = 3.0f;
  }
  return host_tensor({n, num_experts}, logits);
}

struct Case {
  int64_t n;
  int64_t experts;
  int k;
};

TEST(GatingGpu, ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  for (const Case c : {Case{257, 13, 3}, Case{1000, 64, 8}, Case{5, 1, 1}, Case{0, 8, 2}}) {
    for (bool renormalize : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.n << " rows, " << c.experts << " experts, top-" << c.k
                                        << (renormalize ? ", renormalized" : ""));
      const Tensor logits = router_logits(c.n, c.experts, 1);
      Tensor probs = Tensor::empty({c.n, c.experts});
      Tensor ids = Tensor::empty({c.n, c.k}, DType::kI32);
      Tensor weights = Tensor::empty({c.n, c.k});
      gating_forward(cpu_device(), logits, c.k, renormalize, probs, ids, weights);
      Tensor gprobs = poisoned(gpu, {c.n, c.experts});
      Tensor gids = poisoned(gpu, {c.n, c.k}, DType::kI32);
      Tensor gweights = poisoned(gpu, {c.n, c.k});
      gating_forward(gpu, to_device(gpu, logits), c.k, renormalize, gprobs, gids, gweights);
      EXPECT_TRUE(all_close(gprobs, probs, kTol));
      EXPECT_TRUE(all_equal(gids, ids));
      EXPECT_TRUE(all_close(gweights, weights, kTol));

      const Tensor dweights = random_tensor({c.n, c.k}, 2);
      Tensor dlogits = Tensor::empty({c.n, c.experts});
      gating_backward(cpu_device(), probs, ids, dweights, renormalize, dlogits);
      Tensor gdlogits = poisoned(gpu, {c.n, c.experts});
      gating_backward(gpu, to_device(gpu, probs), to_device(gpu, ids), to_device(gpu, dweights),
                      renormalize, gdlogits);
      EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
    }
  }
}

TEST(GatingGpu, TiesGoToTheLowerExpert) {
  CudaDevice gpu(0);
  const Tensor logits = router_logits(2, 13, 3);
  Tensor gprobs = poisoned(gpu, {2, 13});
  Tensor gids = poisoned(gpu, {2, 3}, DType::kI32);
  Tensor gweights = poisoned(gpu, {2, 3});
  gating_forward(gpu, to_device(gpu, logits), 3, true, gprobs, gids, gweights);
  EXPECT_EQ(testing::values_of<int32_t>(gids), (std::vector<int32_t>{0, 1, 2, 1, 12, 0}));
}

TEST(GatingGpu, RouterZLossMatchesCpu) {
  CudaDevice gpu(0);
  for (const Case c : {Case{257, 13, 0}, Case{20000, 64, 0}, Case{1, 1, 0}, Case{0, 8, 0}}) {
    SCOPED_TRACE(::testing::Message() << c.n << " rows, " << c.experts << " experts");
    const Tensor logits = random_tensor({c.n, c.experts}, 4, -6.0, 6.0);
    const Tensor glogits = to_device(gpu, logits);
    Tensor z_sum = Tensor::empty({1});
    router_z_loss_sum(cpu_device(), logits, z_sum);
    Tensor gz_sum = poisoned(gpu, {1});
    router_z_loss_sum(gpu, glogits, gz_sum);
    const double cpu = *z_sum.data<float>();
    const double gpu_value = *gz_sum.on_host().data<float>();
    EXPECT_NEAR(gpu_value, cpu, kTol * std::max(1.0, std::abs(cpu)));
    if (c.n > 0) {
      EXPECT_GT(gpu_value, 0.0);
    }

    Tensor dlogits = random_tensor({c.n, c.experts}, 5);  // accumulated into
    Tensor gdlogits = to_device(gpu, dlogits);
    router_z_loss_backward(gpu, glogits, 0.25f, gdlogits);
    router_z_loss_backward(cpu_device(), logits, 0.25f, dlogits);
    EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
  }
}

// The fused router against the CPU's three ops: the gating outputs as gating_forward
// gives them, selection counts exactly, probability and z-loss sums to rounding. Row
// counts around the 32-token chunks and past the 512 blocks (chunks per block > 1).
TEST(GatingGpu, FusedRouterForwardMatchesCpu) {
  CudaDevice gpu(0);
  for (const Case c : {Case{1, 1, 1}, Case{31, 8, 2}, Case{33, 8, 2}, Case{1000, 64, 8},
                       Case{70001, 6, 2}, Case{300, 300, 4}, Case{0, 8, 2}}) {
    for (bool renormalize : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.n << " rows, " << c.experts << " experts, top-" << c.k
                                        << (renormalize ? ", renormalized" : ""));
      const Tensor logits = router_logits(c.n, c.experts, 6);
      Tensor probs = Tensor::empty({c.n, c.experts});
      Tensor ids = Tensor::empty({c.n, c.k}, DType::kI32);
      Tensor weights = Tensor::empty({c.n, c.k});
      Tensor sums = Tensor::empty({2 * c.experts + 1});
      router_forward(cpu_device(), logits, c.k, renormalize, probs, ids, weights, sums);
      Tensor gprobs = poisoned(gpu, {c.n, c.experts});
      Tensor gids = poisoned(gpu, {c.n, c.k}, DType::kI32);
      Tensor gweights = poisoned(gpu, {c.n, c.k});
      Tensor gsums = poisoned(gpu, {2 * c.experts + 1});
      router_forward(gpu, to_device(gpu, logits), c.k, renormalize, gprobs, gids, gweights, gsums);
      EXPECT_TRUE(all_close(gprobs, probs, kTol));
      EXPECT_TRUE(all_equal(gids, ids));
      EXPECT_TRUE(all_close(gweights, weights, kTol));
      // Selections exactly; probability and z-loss sums to rounding.
      const Tensor flat = sums.reshape({2 * c.experts + 1, 1});
      const Tensor gflat = gsums.reshape({2 * c.experts + 1, 1});
      EXPECT_TRUE(all_equal(gflat.slice_rows(0, c.experts), flat.slice_rows(0, c.experts)));
      EXPECT_TRUE(all_close(gflat.slice_rows(c.experts, 2 * c.experts + 1),
                            flat.slice_rows(c.experts, 2 * c.experts + 1), kTol));
    }
  }
}

// GShard's second-expert dispatch: the device draws the CPU's numbers, bit for bit.
TEST(GatingGpu, GshardDispatchMatchesCpu) {
  CudaDevice gpu(0);
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{70001}}) {
    SCOPED_TRACE(::testing::Message() << n << " tokens");
    const Tensor logits = router_logits(n, 8, 7);
    Tensor probs = Tensor::empty({n, 8}), ids = Tensor::empty({n, 2}, DType::kI32);
    Tensor weights = Tensor::empty({n, 2});
    gating_forward(cpu_device(), logits, 2, true, probs, ids, weights);
    Tensor dispatch = Tensor::empty({n, 2}, DType::kI32);
    gshard_dispatch_ids(cpu_device(), ids, weights, 5, 1u << 20, dispatch);
    Tensor gdispatch = poisoned(gpu, {n, 2}, DType::kI32);
    gshard_dispatch_ids(gpu, to_device(gpu, ids), to_device(gpu, weights), 5, 1u << 20, gdispatch);
    EXPECT_TRUE(all_equal(gdispatch, dispatch));
  }
}

// The sigmoid router (group-limited, biased choice) and its backward against the CPU:
// ids exactly, scores, weights and gradients to rounding; then round-robin routing.
TEST(GatingGpu, SigmoidRouterMatchesCpu) {
  CudaDevice gpu(0);
  const SigmoidGating settings[] = {
      {.k = 4, .renormalize = true, .scaling = 2.5f, .num_groups = 4, .top_groups = 2},
      {.k = 2, .renormalize = false, .scaling = 1.0f, .num_groups = 1, .top_groups = 1}};
  for (const Case c : {Case{257, 16, 0}, Case{1000, 64, 0}, Case{0, 8, 0}}) {
    for (const SigmoidGating& g : settings) {
      SCOPED_TRACE(::testing::Message() << c.n << " rows, " << c.experts << " experts, top-"
                                        << g.k << ", " << g.top_groups << " of " << g.num_groups
                                        << " groups");
      const Tensor logits = router_logits(c.n, c.experts, 8);
      const Tensor bias = random_tensor({c.experts}, 9, -0.005, 0.005);
      Tensor scores = Tensor::empty({c.n, c.experts});
      Tensor ids = Tensor::empty({c.n, g.k}, DType::kI32);
      Tensor weights = Tensor::empty({c.n, g.k});
      Tensor sums = Tensor::empty({2 * c.experts + 1});
      sigmoid_router_forward(cpu_device(), logits, bias, g, scores, ids, weights, sums);
      Tensor gscores = poisoned(gpu, {c.n, c.experts});
      Tensor gids = poisoned(gpu, {c.n, g.k}, DType::kI32);
      Tensor gweights = poisoned(gpu, {c.n, g.k});
      Tensor gsums = poisoned(gpu, {2 * c.experts + 1});
      sigmoid_router_forward(gpu, to_device(gpu, logits), to_device(gpu, bias), g, gscores, gids,
                             gweights, gsums);
      EXPECT_TRUE(all_close(gscores, scores, kTol));
      EXPECT_TRUE(all_equal(gids, ids));
      EXPECT_TRUE(all_close(gweights, weights, kTol));
      EXPECT_TRUE(all_close(gsums, sums, kTol));

      const Tensor dweights = random_tensor({c.n, g.k}, 10);
      Tensor dlogits = Tensor::empty({c.n, c.experts});
      sigmoid_gating_backward(cpu_device(), scores, ids, dweights, g, dlogits);
      Tensor gdlogits = poisoned(gpu, {c.n, c.experts});
      sigmoid_gating_backward(gpu, to_device(gpu, scores), to_device(gpu, ids),
                              to_device(gpu, dweights), g, gdlogits);
      EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
    }
  }
  Tensor ids = Tensor::empty({1001, 3}, DType::kI32), weights = Tensor::empty({1001, 3});
  round_robin_routing(cpu_device(), 17, 8, ids, weights);
  Tensor gids = poisoned(gpu, {1001, 3}, DType::kI32), gweights = poisoned(gpu, {1001, 3});
  round_robin_routing(gpu, 17, 8, gids, gweights);
  EXPECT_TRUE(all_equal(gids, ids));
  EXPECT_TRUE(all_equal(gweights, weights));
}

// `ids` with slots of expert id -1 (no expert): row r's slot r mod (k + 1), so some rows
// keep every slot, others lose one, row 0 its first; and every slot of row 1.
Tensor with_no_expert_slots(const Tensor& ids) {
  const int64_t k = ids.dim(1);
  std::vector<int32_t> holed = testing::values_of<int32_t>(ids);
  for (int64_t r = 0; r < ids.dim(0); ++r)
    if (r % (k + 1) < k) holed[r * k + r % (k + 1)] = -1;
  if (ids.dim(0) > 1) std::fill_n(holed.begin() + k, k, -1);
  return host_tensor(ids.shape(), holed);
}

// Slots of expert id -1 select nothing on the GPU as on the CPU, and reach no other row.
TEST(GatingGpu, BackwardSkipsNoExpertSlotsAsTheCpu) {
  CudaDevice gpu(0);
  const int64_t n = 257, experts = 16;
  const Tensor logits = router_logits(n, experts, 13);
  for (const int k : {1, 3}) {
    for (bool renormalize : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "softmax top-" << k
                                        << (renormalize ? ", renormalized" : ""));
      Tensor probs = Tensor::empty({n, experts});
      Tensor ids = Tensor::empty({n, k}, DType::kI32);
      Tensor weights = Tensor::empty({n, k});
      gating_forward(cpu_device(), logits, k, renormalize, probs, ids, weights);
      const Tensor holed = with_no_expert_slots(ids);
      const Tensor dweights = random_tensor({n, k}, 14);
      Tensor dlogits = Tensor::empty({n, experts});
      gating_backward(cpu_device(), probs, holed, dweights, renormalize, dlogits);
      Tensor gdlogits = poisoned(gpu, {n, experts});
      gating_backward(gpu, to_device(gpu, probs), to_device(gpu, holed), to_device(gpu, dweights),
                      renormalize, gdlogits);
      EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
    }
  }
  const SigmoidGating g{.k = 4, .renormalize = true, .scaling = 2.5f, .num_groups = 4,
                        .top_groups = 2};
  const Tensor bias = random_tensor({experts}, 15, -0.005, 0.005);
  Tensor scores = Tensor::empty({n, experts});
  Tensor ids = Tensor::empty({n, g.k}, DType::kI32);
  Tensor weights = Tensor::empty({n, g.k});
  sigmoid_gating_forward(cpu_device(), logits, bias, g, scores, ids, weights);
  const Tensor holed = with_no_expert_slots(ids);
  const Tensor dweights = random_tensor({n, g.k}, 16);
  Tensor dlogits = Tensor::empty({n, experts});
  sigmoid_gating_backward(cpu_device(), scores, holed, dweights, g, dlogits);
  Tensor gdlogits = poisoned(gpu, {n, experts});
  sigmoid_gating_backward(gpu, to_device(gpu, scores), to_device(gpu, holed),
                          to_device(gpu, dweights), g, gdlogits);
  EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
}

// Expert choice against the CPU: the same tokens taken (probabilities far apart per
// expert, and row 0's exact ties), weights and gradients to rounding.
TEST(GatingGpu, ExpertChoiceMatchesCpu) {
  CudaDevice gpu(0);
  for (const Case c : {Case{257, 16, 40}, Case{1000, 8, 250}, Case{3, 4, 5}, Case{0, 8, 1}}) {
    SCOPED_TRACE(::testing::Message() << c.n << " rows, " << c.experts << " experts, capacity "
                                      << c.k);
    const Tensor logits = router_logits(c.n, c.experts, 11);
    Tensor probs = Tensor::empty({c.n, c.experts});
    Tensor ids = Tensor::empty({c.n, c.experts}, DType::kI32);
    Tensor weights = Tensor::empty({c.n, c.experts});
    Tensor sums = Tensor::empty({2 * c.experts + 1});
    expert_choice_router_forward(cpu_device(), logits, c.k, probs, ids, weights, sums);
    Tensor gprobs = poisoned(gpu, {c.n, c.experts});
    Tensor gids = poisoned(gpu, {c.n, c.experts}, DType::kI32);
    Tensor gweights = poisoned(gpu, {c.n, c.experts});
    Tensor gsums = poisoned(gpu, {2 * c.experts + 1});
    // The choice on the CPU's probabilities, so both rank the same values.
    expert_choice_forward(gpu, to_device(gpu, probs), c.k, gids, gweights);
    EXPECT_TRUE(all_equal(gids, ids));
    EXPECT_TRUE(all_equal(gweights, weights));
    expert_choice_router_forward(gpu, to_device(gpu, logits), c.k, gprobs, gids, gweights, gsums);
    EXPECT_TRUE(all_close(gprobs, probs, kTol));
    EXPECT_TRUE(all_close(gsums, sums, kTol));

    const Tensor dweights = random_tensor({c.n, c.experts}, 12);
    Tensor dlogits = Tensor::empty({c.n, c.experts});
    expert_choice_backward(cpu_device(), probs, ids, dweights, dlogits);
    Tensor gdlogits = poisoned(gpu, {c.n, c.experts});
    expert_choice_backward(gpu, to_device(gpu, probs), to_device(gpu, ids),
                           to_device(gpu, dweights), gdlogits);
    EXPECT_TRUE(all_close(gdlogits, dlogits, kTol));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
