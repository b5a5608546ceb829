// Padded windows (data.packing PAD) in the MoE layer: a batch of padded sequences routes,
// drops, counts and differentiates exactly as the batch of its real tokens alone (the
// sequences' text rows one after another): pad rows go to no expert, take no capacity,
// add nothing to the routing sums, are left out of the routing the layer reports
// (last_routing) and their logits get no gradient. The sequence-wise aux
// loss of a padded batch is the mean of each sequence's loss run alone at its own length.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/runtime/rng.h"
#include "moe/moe_layer.h"
#include "tests/moe/small_moe_layer.h"

namespace switchyard {
namespace {

constexpr int kExperts = testing::kSmallLayerExperts;
constexpr int64_t kHidden = testing::kSmallLayerHidden;
constexpr int64_t kWindow = 6;
// Sequence lengths: a short one, a full window, a two-token one and an empty document.
const std::vector<int32_t> kRealTokens = {4, 6, 2, 0};

// The real rows of a padded (sequences x kWindow, width) tensor, one after another.
Tensor real_rows(const Tensor& padded) {
  int64_t total = 0;
  for (int32_t t : kRealTokens) total += t;
  Tensor out = Tensor::empty({total, padded.row_size()}, padded.dtype());
  int64_t row = 0;
  for (size_t b = 0; b < kRealTokens.size(); ++b) {
    const int64_t first = static_cast<int64_t>(b) * kWindow;
    out.slice_rows(row, row + kRealTokens[b])
        .copy_from(padded.slice_rows(first, first + kRealTokens[b]));
    row += kRealTokens[b];
  }
  return out;
}

// One layer's forward and backward (aux and z losses weighted by 1) with its outputs.
struct LayerRun {
  Tensor y, dx, router_grad, experts_grad;
  RouterStats stats;
  MoeRouting routing;  // last_routing() after the forward, copied
};

// A copy of `t` on the host that no later forward or backward can overwrite.
Tensor host_copy(const Tensor& t) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype());
  copy.copy_from(t);
  return copy;
}

LayerRun run_layer(const testing::SmallLayerConfig& setup, const Tensor& x, const Tensor& dy,
                   int64_t seq_len, std::span<const int32_t> real_tokens, float seq_aux_scale) {
  ParamStore params;
  MoeLayer layer(params, "mlp.", setup.model, setup.moe, nullptr);
  params.allocate(cpu_device());
  params.initialize(31);
  LayerRun r;
  r.stats.begin(cpu_device(), 1);
  Rng rng(5);
  r.y = layer.forward(cpu_device(), x, /*training=*/true, rng, r.stats, seq_len, real_tokens)
            .on_host();
  r.stats.collect();
  const MoeRouting routing = layer.last_routing();
  r.routing = {host_copy(routing.logits), host_copy(routing.probs), host_copy(routing.expert_ids),
               host_copy(routing.weights)};
  const std::vector<float> g = r.stats.aux_loss_prob_gradient(1.0, /*per_layer=*/false, 0);
  Tensor aux_grad = Tensor::empty({kExperts}, DType::kF32);
  std::copy(g.begin(), g.end(), aux_grad.data<float>());
  r.dx = layer.backward(cpu_device(), dy, aux_grad, /*z_loss_scale=*/1.0f, seq_aux_scale).on_host();
  r.router_grad = params.find("mlp.gate.weight")->grad.on_host();
  r.experts_grad = params.find("mlp.experts.gate_up_proj")->grad.on_host();
  return r;
}

void expect_near(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], tol) << what << " at " << i;
}

class PaddingTest : public ::testing::TestWithParam<testing::Routing> {};
// Expert choice takes each expert's tokens from the whole batch, so only the batch of all
// the real tokens can equal a padded one.
class WholeBatchPaddingTest : public ::testing::TestWithParam<testing::Routing> {};

TEST_P(WholeBatchPaddingTest, PaddedBatchEqualsItsRealTokensAlone) {
  // Capacity factor 1 drops assignments, so capacity over the real tokens shows.
  const testing::SmallLayerConfig setup =
      testing::small_layer_config(GetParam(), /*capacity_factor=*/1.0f, /*seq_aux_coef=*/0);
  const int64_t n = static_cast<int64_t>(kRealTokens.size()) * kWindow;
  const Tensor x = testing::normal_tensor({n, kHidden}, 7);
  const Tensor dy = testing::normal_tensor({n, kHidden}, 8);
  const LayerRun padded = run_layer(setup, x, dy, kWindow, kRealTokens, 0);
  const LayerRun alone = run_layer(setup, real_rows(x), real_rows(dy), kWindow, {}, 0);

  EXPECT_EQ(padded.stats.routed_tokens, alone.stats.routed_tokens);
  EXPECT_EQ(padded.stats.routed_tokens, 12);
  EXPECT_EQ(padded.stats.assignments, alone.stats.assignments);
  EXPECT_EQ(padded.stats.dropped_assignments, alone.stats.dropped_assignments);
  // The capacity binds (expert choice's is in its choice, which drops nothing more).
  if (GetParam().gating != config::EXPERT_CHOICE) {
    EXPECT_GT(alone.stats.dropped_assignments, 0);
  }
  EXPECT_EQ(padded.stats.selections_per_expert, alone.stats.selections_per_expert);
  for (int e = 0; e < kExperts; ++e)
    EXPECT_NEAR(padded.stats.prob_sum_per_expert[e], alone.stats.prob_sum_per_expert[e], 1e-5);
  EXPECT_NEAR(padded.stats.z_loss, alone.stats.z_loss, 1e-5);
  EXPECT_NEAR(padded.stats.aux_loss(false), alone.stats.aux_loss(false), 1e-6);
  EXPECT_DOUBLE_EQ(padded.stats.worst_load_ratio, alone.stats.worst_load_ratio);

  expect_near(real_rows(padded.y), alone.y, 1e-5, "real outputs");
  expect_near(real_rows(padded.dx), alone.dx, 1e-5, "real input gradients");
  // Padding is routed nowhere: a zero output and no gradient through the router.
  const Tensor zeros = Tensor::zeros({n, kHidden}, DType::kF32);
  for (size_t b = 0; b < kRealTokens.size(); ++b) {
    const int64_t pad_begin = static_cast<int64_t>(b) * kWindow + kRealTokens[b];
    const int64_t pad_end = static_cast<int64_t>(b + 1) * kWindow;
    expect_near(padded.y.slice_rows(pad_begin, pad_end), zeros.slice_rows(pad_begin, pad_end), 0,
                "padding output");
    expect_near(padded.dx.slice_rows(pad_begin, pad_end), zeros.slice_rows(pad_begin, pad_end), 0,
                "padding input gradient");
  }
  expect_near(padded.router_grad, alone.router_grad, 1e-5, "router gradient");
  expect_near(padded.experts_grad, alone.experts_grad, 1e-5, "expert gradient");
  // The routing the layer reports (bench balance) is that of the real tokens: padding,
  // routed nowhere, is left out of it.
  expect_near(padded.routing.logits, alone.routing.logits, 1e-5, "reported router logits");
  expect_near(padded.routing.probs, alone.routing.probs, 1e-5, "reported probabilities");
  expect_near(padded.routing.weights, alone.routing.weights, 1e-5, "reported weights");
  ASSERT_EQ(padded.routing.expert_ids.rows(), 12);
  const int32_t* padded_ids = padded.routing.expert_ids.data<int32_t>();
  const int32_t* alone_ids = alone.routing.expert_ids.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(padded_ids, padded_ids + padded.routing.expert_ids.numel()),
            std::vector<int32_t>(alone_ids, alone_ids + alone.routing.expert_ids.numel()));
}

TEST_P(PaddingTest, SequenceAuxLossTakesEachSequenceAtItsOwnLength) {
  const testing::SmallLayerConfig setup =
      testing::small_layer_config(GetParam(), /*capacity_factor=*/0, /*seq_aux_coef=*/1.0f);
  const int64_t n = static_cast<int64_t>(kRealTokens.size()) * kWindow;
  const Tensor x = testing::normal_tensor({n, kHidden}, 9);
  const Tensor no_dy = Tensor::zeros({n, kHidden}, DType::kF32);
  const float scale = 0.5f;
  const LayerRun padded = run_layer(setup, x, no_dy, kWindow, kRealTokens, scale);
  // Each non-empty sequence alone, as a batch of one sequence of its own length: the
  // padded batch's loss is the mean over its sequences (the empty one adds 0), and so is
  // its gradient, whose router part is taken without the aux and z losses.
  const double sequences = static_cast<double>(kRealTokens.size());
  double loss = 0;
  Tensor router_grad = Tensor::zeros(padded.router_grad.shape(), DType::kF32);
  for (size_t b = 0; b < kRealTokens.size(); ++b) {
    const int32_t t = kRealTokens[b];
    if (t == 0) continue;
    const int64_t first = static_cast<int64_t>(b) * kWindow;
    const LayerRun alone =
        run_layer(setup, x.slice_rows(first, first + t), Tensor::zeros({t, kHidden}, DType::kF32),
                  t, {}, static_cast<float>(scale / sequences));
    loss += alone.stats.seq_aux_loss / sequences;
    // run_layer adds the aux and z losses' gradients too: take the sequence-wise part
    // alone by running once more without it.
    const LayerRun no_seq = run_layer(setup, x.slice_rows(first, first + t),
                                      Tensor::zeros({t, kHidden}, DType::kF32), t, {}, 0);
    for (int64_t i = 0; i < router_grad.numel(); ++i)
      router_grad.data<float>()[i] +=
          alone.router_grad.data<float>()[i] - no_seq.router_grad.data<float>()[i];
  }
  EXPECT_NEAR(padded.stats.seq_aux_loss, loss, 1e-5 * loss);
  EXPECT_GT(loss, 0.5);
  const LayerRun padded_no_seq = run_layer(setup, x, no_dy, kWindow, kRealTokens, 0);
  Tensor padded_seq_grad = Tensor::empty(router_grad.shape(), DType::kF32);
  for (int64_t i = 0; i < router_grad.numel(); ++i)
    padded_seq_grad.data<float>()[i] =
        padded.router_grad.data<float>()[i] - padded_no_seq.router_grad.data<float>()[i];
  expect_near(padded_seq_grad, router_grad, 1e-5, "sequence-wise router gradient");
}

INSTANTIATE_TEST_SUITE_P(Gatings, WholeBatchPaddingTest,
                         ::testing::Values(testing::kSoftmaxRenormalized, testing::kSoftmax,
                                           testing::kSigmoid, testing::kExpertChoice));
INSTANTIATE_TEST_SUITE_P(Gatings, PaddingTest,
                         ::testing::Values(testing::kSoftmaxRenormalized, testing::kSoftmax,
                                           testing::kSigmoid));

}  // namespace
}  // namespace switchyard
