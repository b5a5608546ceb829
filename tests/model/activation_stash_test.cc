// Transformer::stash_activations / restore_activations: a pipeline stage holds several
// micro-batches between their forward and backward. Forward 0, stash, forward 1, stash,
// restore 0, backward, restore 1, backward gives every loss, routing statistic and
// gradient of forward 0, backward 0, forward 1, backward 1 bit for bit.
#include <gtest/gtest.h>

#include <vector>

#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tests/model/pipeline_test_util.h"

namespace switchyard {
namespace {

using pipeline_test::Case;

struct Outcome {
  ParamStore params;
  std::vector<LossParts> losses;
  std::vector<std::vector<double>> selections;  // router_stats() after each backward
};

// Two micro-batches through `model`, their backwards in order; `interleave` holds both
// forwards' activations aside before either backward.
void run(const config::Recipe& recipe, bool interleave, Outcome& out) {
  Transformer model(recipe, out.params);
  out.params.allocate(cpu_device());
  out.params.initialize(5);
  pipeline_test::perturb_norms(out.params);
  refresh_working_copies(cpu_device(), out.params);
  const bool documents = recipe.data().document_attention();
  std::vector<Transformer::Activations> held;
  for (int micro = 0; micro < 2; ++micro) {
    const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(9 + micro, documents);
    Rng rng = Rng(11).fork(micro);
    out.losses.push_back(model.forward(cpu_device(), mb.ids, mb.targets, /*training=*/true, rng,
                                       nullptr, mb.doc_starts));
    if (interleave) {
      held.push_back(model.stash_activations());
      continue;
    }
    model.backward(cpu_device(), 0.5f);
    out.selections.push_back(model.router_stats().selections_per_expert);
  }
  for (auto& saved : held) {
    model.restore_activations(std::move(saved));
    model.backward(cpu_device(), 0.5f);
    out.selections.push_back(model.router_stats().selections_per_expert);
  }
}

class ActivationStashTest : public ::testing::TestWithParam<Case> {};

TEST_P(ActivationStashTest, InterleavedMicroBatchesMatchInOrderBitForBit) {
  Case c = GetParam();
  config::Recipe recipe = pipeline_test::recipe_for(c, 3);
  recipe.mutable_data()->set_document_attention(c.documents);
  Outcome in_order, interleaved;
  run(recipe, false, in_order);
  run(recipe, true, interleaved);
  for (size_t m = 0; m < 2; ++m) {
    EXPECT_EQ(interleaved.losses[m].total, in_order.losses[m].total);
    EXPECT_EQ(interleaved.losses[m].cross_entropy, in_order.losses[m].cross_entropy);
    EXPECT_EQ(interleaved.losses[m].aux_loss, in_order.losses[m].aux_loss);
    EXPECT_EQ(interleaved.losses[m].z_loss, in_order.losses[m].z_loss);
    EXPECT_EQ(interleaved.selections[m], in_order.selections[m]);
  }
  // The two micro-batches differ, so a backward on the wrong one would show.
  EXPECT_NE(in_order.losses[0].cross_entropy, in_order.losses[1].cross_entropy);
  const auto& expected = in_order.params.params();
  const auto& got = interleaved.params.params();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(pipeline_test::same_bits(got[i].grad, expected[i].grad)) << got[i].name;
}

INSTANTIATE_TEST_SUITE_P(
    Models, ActivationStashTest,
    ::testing::Values(pipeline_test::kCases[0], pipeline_test::kCases[1], pipeline_test::kCases[2],
                      pipeline_test::kCases[3], pipeline_test::kCases[4], pipeline_test::kCases[5],
                      Case{"all_layer_aux", "first_dense_layers: 1",
                           "num_experts: 4 top_k: 2 aux_loss_coef: 0.1 z_loss_coef: 0.01", "",
                           false}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ActivationStash, StashLeavesTheModelAsBeforeAForward) {
  const config::Recipe recipe = pipeline_test::recipe_for(pipeline_test::kCases[0], 2);
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(5);
  const int kind = static_cast<int>(MemoryKind::kActivations);
  const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(3, false);
  Rng rng(1);
  Transformer::Activations saved;
  {
    model.forward(cpu_device(), mb.ids, mb.targets, /*training=*/true, rng);
    const int64_t held = cpu_device().memory_stats().current_bytes[kind];
    saved = model.stash_activations();
    EXPECT_TRUE(model.router_stats().layers.empty());
    // The stash holds the activations: stashing frees nothing, restoring and the
    // backward do.
    EXPECT_EQ(cpu_device().memory_stats().current_bytes[kind], held);
  }
  const int64_t before = cpu_device().memory_stats().current_bytes[kind];
  model.restore_activations(std::move(saved));
  EXPECT_EQ(model.router_stats().layers.size(), 1u);
  model.backward(cpu_device(), 1.0f);
  EXPECT_LT(cpu_device().memory_stats().current_bytes[kind], before);
}

}  // namespace
}  // namespace switchyard
