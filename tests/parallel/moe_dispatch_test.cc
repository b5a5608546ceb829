// Expert and tensor parallelism against a single-process reference: the all-to-all
// dispatch and combine of MoeLayer must give, on every rank, exactly what the same layer
// with all E experts on one process gives for that rank's tokens.
//
// Every rank builds the reference layer (no communicator, all experts) with the same
// seeded parameters, and a parallel layer over the world holding the router and this
// rank's E/P experts copied from it (those an expert placement gives it, where one does).
//  - Expert parallelism: each rank routes its own tokens; the reference processes them
//    alone, the expert-parallel layer sends them to the experts' ranks.
//  - Tensor parallelism (parallel folding) on top: every rank holds the same P x n
//    tokens, routes its n of them and all-gathers the outputs; the reference processes
//    all of them.
//
// Inputs and parameters are small dyadic values chosen so that the whole expert
// computation is exact whatever order a GEMM sums in (which, with OpenBLAS, can depend
// on the matrix's row count and the CPU): tokens are positive integers, router weights
// multiples of 1/8, expert weights integers with gate rows in [2, 3], so every gate
// pre-activation is at least 32 and silu(g) rounds to g. The combine sums a token's k
// expert outputs in the same order on both paths, so the outputs match bit for bit.
// Capacity drops too: the capacity and the drop decisions are made from the same
// tokens on both paths.
//
// Backward: the router gradient is compared to a relative 1e-5. dx and the expert
// weight gradients are sums over non-dyadic values (softmax weights) that the parallel
// path takes in GEMMs of other row counts (the rows of all ranks together), so in
// another order: they are compared to 1e-5 of the tensor's largest magnitude (see
// max_normwise_error). dx's terms reach the thousands and can cancel to single digits,
// where one ulp of a term is already 3e-5 of the element (seen with OpenBLAS's AVX2
// kernels; normwise the difference was 1.5e-7).
//
// Each test makes all its collective calls before checking, so a failed check on one
// rank cannot leave the others waiting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"
#include "gtest/gtest.h"
#include "moe/moe_layer.h"
#include "moe/router_stats.h"
#include "tests/parallel/parallel_test_env.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_integers;
using testing::values_of;
using testing::world;

constexpr int64_t kHidden = 16;
constexpr int64_t kFfn = 8;
constexpr int64_t kTokens = 24;
constexpr int kTopK = 2;
const std::string kPrefix = "moe.";

void fill(Tensor& t, const std::vector<float>& values) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::memcpy(t.raw_data(), values.data(), t.nbytes());
}

// max_i |a_i - b_i| / max(1, max_i |b_i|): the error relative to the tensor's scale.
// Element-wise relative error is the wrong measure for a sum taken in another order:
// its rounding error scales with the terms, and an element whose terms cancel can have
// a larger relative error while being exact to the precision of the sum.
double max_normwise_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double scale = 1, worst = 0;
  for (float y : b) scale = std::max(scale, std::abs(static_cast<double>(y)));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst / scale;
}

std::vector<float> scaled(std::vector<float> v, float scale) {
  for (float& x : v) x *= scale;
  return v;
}

struct Layer {
  explicit Layer(ShardPlacement placement) : params(placement) {}
  ParamStore params;
  std::unique_ptr<MoeLayer> layer;
  Param& param(const std::string& name) {
    Param* p = params.find(kPrefix + name);
    SY_CHECK_MSG(p != nullptr, "missing parameter");
    return *p;
  }
};

// `expert_order`: the expert placement (empty: contiguous).
std::unique_ptr<Layer> make_layer(const config::ModelConfig& model, const config::MoeConfig& moe,
                                  Communicator* ep, Communicator* tp = nullptr,
                                  const std::vector<int>& expert_order = {}) {
  ShardPlacement placement;
  if (ep) placement = {0, 1, ep->rank(), ep->size(), expert_order};
  auto l = std::make_unique<Layer>(placement);
  l->layer = std::make_unique<MoeLayer>(l->params, kPrefix, model, moe, ep, tp);
  l->params.allocate(cpu_device());
  return l;
}

struct Result {
  std::vector<float> y, dx;
  RouterStats stats;
};

Result run(Layer& l, const Tensor& x, const Tensor& dy, const Tensor& aux_prob_grad,
           int experts) {
  Result r;
  Rng rng(7);
  r.stats.begin(cpu_device(), 1);
  Tensor y = l.layer->forward(cpu_device(), x, /*training=*/false, rng, r.stats, /*seq_len=*/1);
  r.stats.collect();
  r.y = values_of<float>(y);
  Tensor dx = l.layer->backward(cpu_device(), dy, aux_prob_grad, /*z_loss_scale=*/1e-2f);
  r.dx = values_of<float>(dx);
  return r;
}

struct Setup {
  config::ModelConfig model;
  config::MoeConfig moe;
};

Setup make_setup(int experts, float capacity_factor) {
  Setup s;
  s.model.set_hidden_size(kHidden);
  s.model.set_init_std(0.02f);
  s.moe.set_num_experts(experts);
  s.moe.set_top_k(kTopK);
  s.moe.set_gating(config::TOP_K);
  s.moe.set_score_function(config::SOFTMAX);
  s.moe.set_renormalize(true);
  s.moe.set_expert_ffn_hidden_size(kFfn);
  s.moe.set_capacity_factor(capacity_factor);
  return s;
}

// Fills the reference layer's parameters (the same on every rank: same seeds) and copies
// the router and this rank's experts (those its placement gives it) into the parallel layer.
void share_parameters(Layer& ref, Layer& parallel, int experts, int local) {
  // The experts compute exactly, whatever the GEMMs' summation order: tokens are
  // positive integers and gate rows integers in [2, 3], so every gate pre-activation is
  // at least 32, where silu(g) = g / (1 + exp(-g)) rounds to g; every product and sum
  // after that is a small integer. Router logits are multiples of 1/8.
  fill(ref.param("gate.weight").value,
       scaled(random_integers<float>(experts * kHidden, 11, -2, 2), 0.125f));
  std::vector<float> gate_up = random_integers<float>(experts * 2 * kFfn * kHidden, 12, -1, 1);
  const std::vector<float> gates = random_integers<float>(gate_up.size(), 14, 2, 3);
  for (size_t i = 0; i < gate_up.size(); ++i)
    if ((i / (kFfn * kHidden)) % 2 == 0) gate_up[i] = gates[i];  // expert e's gate rows
  fill(ref.param("experts.gate_up_proj").value, gate_up);
  fill(ref.param("experts.down_proj").value,
       random_integers<float>(experts * kHidden * kFfn, 13, -1, 1));
  parallel.param("gate.weight").value.copy_from(ref.param("gate.weight").value);
  for (const char* name : {"experts.gate_up_proj", "experts.down_proj"}) {
    const Param& shard = parallel.param(name);
    EXPECT_EQ(shard.value.dim(0), local);
    for (int64_t row = 0; row < local; ++row) {
      const int64_t expert = shard.whole_row(row);
      const Tensor whole_row = ref.param(name).value.slice_rows(expert, expert + 1);
      shard.value.slice_rows(row, row + 1).copy_from(whole_row);
    }
  }
}

// The expert-parallel shards of `name`'s gradient, gathered in rank order and put back in
// expert order when `expert_order` places them.
std::vector<float> gathered_expert_grad(Communicator& comm, Layer& parallel, const char* name,
                                        const std::vector<int>& expert_order = {}) {
  const Tensor& shard = parallel.param(name).grad;
  Tensor all = Tensor::empty({shard.numel() * comm.size()});
  comm.all_gather(shard, all);
  const std::vector<float> placed = values_of<float>(all);
  if (expert_order.empty()) return placed;
  const size_t per_expert = placed.size() / expert_order.size();
  std::vector<float> in_order(placed.size());
  for (size_t position = 0; position < expert_order.size(); ++position)
    std::copy_n(placed.begin() + position * per_expert, per_expert,
                in_order.begin() + expert_order[position] * per_expert);
  return in_order;
}

// capacity_factor 0: dropless; 1: tokens beyond ceil(n * k / E) per expert are dropped.
// `expert_order`: the expert placement (empty: contiguous).
void check_against_reference(int experts, float capacity_factor,
                             const std::vector<int>& expert_order = {}) {
  Communicator& comm = world();
  const int P = comm.size();
  const int rank = comm.rank();
  if (experts % P != 0) GTEST_SKIP() << P << " ranks do not divide " << experts << " experts";
  const int local = experts / P;
  const Setup setup = make_setup(experts, capacity_factor);
  std::unique_ptr<Layer> ref = make_layer(setup.model, setup.moe, nullptr);
  std::unique_ptr<Layer> ep = make_layer(setup.model, setup.moe, &comm, nullptr, expert_order);
  share_parameters(*ref, *ep, experts, local);

  // This rank's own tokens and output gradient.
  Tensor x = host_tensor({kTokens, kHidden},
                         random_integers<float>(kTokens * kHidden, 100 + rank, 1, 2));
  Tensor dy = host_tensor({kTokens, kHidden},
                          random_integers<float>(kTokens * kHidden, 200 + rank, -2, 2));
  Tensor aux_prob_grad =
      host_tensor({experts}, scaled(random_integers<float>(experts, 300 + rank, -4, 4), 1.0f / 64));

  const Result want = run(*ref, x, dy, aux_prob_grad, experts);  // no communication
  const Result got = run(*ep, x, dy, aux_prob_grad, experts);    // all-to-all

  // Expert gradients: the expert-parallel shards, gathered in rank order, against the
  // sum over ranks of every rank's reference gradients for all experts.
  std::vector<std::vector<float>> gathered, summed;
  for (const char* name : {"experts.gate_up_proj", "experts.down_proj"}) {
    gathered.push_back(gathered_expert_grad(comm, *ep, name, expert_order));
    Tensor ref_grad = Tensor::empty(ref->param(name).grad.shape());
    ref_grad.copy_from(ref->param(name).grad);
    comm.all_reduce_sum(ref_grad);
    summed.push_back(values_of<float>(ref_grad));
  }
  int64_t dropped = want.stats.dropped_assignments;
  comm.all_reduce_sum(&dropped, 1);
  // All collectives are done; checks only from here on.

  // Forward: bit for bit.
  EXPECT_TRUE(any_nonzero(want.y));
  ASSERT_EQ(got.y.size(), want.y.size());
  for (size_t i = 0; i < want.y.size(); ++i)
    EXPECT_EQ(got.y[i], want.y[i]) << "rank " << rank << " y[" << i << "]";
  EXPECT_EQ(got.stats.selections_per_expert, want.stats.selections_per_expert);
  EXPECT_EQ(got.stats.prob_sum_per_expert, want.stats.prob_sum_per_expert);
  EXPECT_EQ(got.stats.dropped_assignments, want.stats.dropped_assignments);
  if (capacity_factor > 0)
    EXPECT_GT(dropped, 0) << "the capacity case should drop assignments somewhere";
  else
    EXPECT_EQ(dropped, 0);

  // Backward.
  EXPECT_TRUE(any_nonzero(want.dx));
  EXPECT_LE(max_normwise_error(got.dx, want.dx), 1e-5) << "dx";
  const std::vector<float> router_got = values_of<float>(ep->param("gate.weight").grad);
  const std::vector<float> router_want = values_of<float>(ref->param("gate.weight").grad);
  EXPECT_TRUE(any_nonzero(router_want));
  EXPECT_LE(max_relative_error(router_got, router_want), 1e-5) << "router grad";
  const char* names[] = {"experts.gate_up_proj", "experts.down_proj"};
  for (size_t i = 0; i < gathered.size(); ++i) {
    EXPECT_TRUE(any_nonzero(summed[i])) << names[i];
    EXPECT_LE(max_normwise_error(gathered[i], summed[i]), 1e-5) << names[i] << " grad";
  }
}

// Tensor and expert parallelism over the world: every rank holds the same P x kTokens
// tokens and routes kTokens of them; the reference routes all of them at once.
void check_tensor_parallel_against_reference(int experts, float capacity_factor) {
  Communicator& comm = world();
  const int P = comm.size();
  const int rank = comm.rank();
  if (experts % P != 0) GTEST_SKIP() << P << " ranks do not divide " << experts << " experts";
  const Setup setup = make_setup(experts, capacity_factor);
  std::unique_ptr<Layer> ref = make_layer(setup.model, setup.moe, nullptr);
  std::unique_ptr<Layer> tp = make_layer(setup.model, setup.moe, &comm, &comm);
  share_parameters(*ref, *tp, experts, experts / P);

  const int64_t tokens = kTokens * P;
  Tensor x = host_tensor({tokens, kHidden}, random_integers<float>(tokens * kHidden, 400, 1, 2));
  Tensor dy = host_tensor({tokens, kHidden}, random_integers<float>(tokens * kHidden, 500, -2, 2));
  Tensor aux_prob_grad =
      host_tensor({experts}, scaled(random_integers<float>(experts, 600, -4, 4), 1.0f / 64));
  const Result want = run(*ref, x, dy, aux_prob_grad, experts);
  const Result got = run(*tp, x, dy, aux_prob_grad, experts);
  std::vector<std::vector<float>> gathered;
  for (const char* name : {"experts.gate_up_proj", "experts.down_proj"})
    gathered.push_back(gathered_expert_grad(comm, *tp, name));
  // All collectives are done; checks only from here on.

  ASSERT_EQ(got.y.size(), want.y.size());
  EXPECT_TRUE(any_nonzero(want.y));
  for (size_t i = 0; i < want.y.size(); ++i)
    EXPECT_EQ(got.y[i], want.y[i]) << "rank " << rank << " y[" << i << "]";
  EXPECT_EQ(got.stats.selections_per_expert, want.stats.selections_per_expert);
  EXPECT_LE(max_relative_error(got.stats.prob_sum_per_expert, want.stats.prob_sum_per_expert),
            1e-6);
  EXPECT_NEAR(got.stats.z_loss, want.stats.z_loss, 1e-6 * want.stats.z_loss);
  EXPECT_EQ(got.stats.layers[0].tokens, tokens);
  EXPECT_EQ(got.stats.dropped_assignments, want.stats.dropped_assignments);
  if (capacity_factor > 0) {
    EXPECT_GT(want.stats.dropped_assignments, 0);
  }

  EXPECT_TRUE(any_nonzero(want.dx));
  EXPECT_LE(max_normwise_error(got.dx, want.dx), 1e-5) << "dx";
  const std::vector<float> router_want = values_of<float>(ref->param("gate.weight").grad);
  EXPECT_TRUE(any_nonzero(router_want));
  EXPECT_LE(max_normwise_error(values_of<float>(tp->param("gate.weight").grad), router_want), 1e-5)
      << "router grad";
  const char* names[] = {"experts.gate_up_proj", "experts.down_proj"};
  for (size_t i = 0; i < gathered.size(); ++i) {
    const std::vector<float> want_grad = values_of<float>(ref->param(names[i]).grad);
    EXPECT_TRUE(any_nonzero(want_grad)) << names[i];
    EXPECT_LE(max_normwise_error(gathered[i], want_grad), 1e-5) << names[i] << " grad";
  }
}

TEST(MoeDispatchTest, DroplessMatchesSingleProcessReference) { check_against_reference(8, 0.0f); }

TEST(MoeDispatchTest, CapacityDropsMatchSingleProcessReference) {
  check_against_reference(8, 1.0f);
}

TEST(MoeDispatchTest, FourExpertsMatchSingleProcessReference) { check_against_reference(4, 0.0f); }

// parallel.expert_placement: the dispatcher sends each assignment to the rank and slot
// holding its expert; outputs and statistics are those of one process, bit for bit.
TEST(MoeDispatchTest, PlacedExpertsMatchSingleProcessReference) {
  check_against_reference(8, 0.0f, {5, 2, 7, 0, 1, 6, 3, 4});
}

TEST(MoeDispatchTest, PlacedExpertsWithCapacityMatchSingleProcessReference) {
  check_against_reference(8, 1.0f, {5, 2, 7, 0, 1, 6, 3, 4});
}

TEST(MoeDispatchTest, TensorParallelDroplessMatchesSingleProcessReference) {
  check_tensor_parallel_against_reference(8, 0.0f);
}

TEST(MoeDispatchTest, TensorParallelCapacityMatchesSingleProcessReference) {
  check_tensor_parallel_against_reference(8, 1.0f);
}

}  // namespace
}  // namespace switchyard
