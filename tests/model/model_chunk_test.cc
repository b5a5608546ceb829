// Pipeline chunks (ModelChunk, forward_chunk / backward_chunk): a model split into chunks
// of uneven layers, each with its own ParamStore holding the same weights, run chunk
// after chunk with the hidden states and their gradients passed by hand, gives the whole
// model's cross-entropy, router losses and every gradient bit for bit: the routing and
// loss sums go with the hidden states forward through each chunk, the last chunk alone
// reporting the losses, and with the all-layer aux loss the whole model's sums come back
// from the last.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tests/model/pipeline_test_util.h"

namespace switchyard {
namespace {

using pipeline_test::Case;

constexpr int kLayers = 5;
const std::vector<ModelChunk> kChunks = {{0, 2}, {2, 1}, {3, 2}};

struct Built {
  std::unique_ptr<ParamStore> params = std::make_unique<ParamStore>();
  std::unique_ptr<Transformer> model;
};

Built build(const config::Recipe& recipe, ModelChunk chunk) {
  Built b;
  b.model = std::make_unique<Transformer>(recipe, *b.params, ModelParallel{}, chunk);
  b.params->allocate(cpu_device());
  b.params->initialize(5);
  pipeline_test::perturb_norms(*b.params);
  refresh_working_copies(cpu_device(), *b.params);
  return b;
}

config::Recipe recipe_of(const Case& c) {
  config::Recipe recipe = pipeline_test::recipe_for(c, kLayers);
  recipe.mutable_data()->set_document_attention(c.documents);
  return recipe;
}

// Runs `recipe` whole and as `split`, chunk after chunk, and compares them.
void expect_chunks_give_the_whole_model(const config::Recipe& recipe, bool documents,
                                        const std::vector<ModelChunk>& split) {
  const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(7, documents);
  const Rng rng(21);

  Built whole = build(recipe, {});
  const LossParts expected = whole.model->forward(cpu_device(), mb.ids, mb.targets,
                                                  /*training=*/true, rng, nullptr, mb.doc_starts);
  whole.model->backward(cpu_device(), 0.5f);

  std::vector<Built> chunks;
  for (const ModelChunk& c : split) chunks.push_back(build(recipe, c));
  Tensor hidden;
  RoutingSums sums;
  LossParts last;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Transformer& m = *chunks[i].model;
    EXPECT_EQ(m.has_embedding(), i == 0);
    EXPECT_EQ(m.has_head(), i + 1 == chunks.size());
    const Transformer::ChunkOutput out =
        m.forward_chunk(cpu_device(), hidden, mb.ids, mb.targets, rng, mb.doc_starts,
                        /*training=*/true, Tensor(), sums);
    EXPECT_EQ(out.hidden.defined(), !m.has_head());
    hidden = out.hidden;
    sums = out.sums;
    if (!m.has_head()) {
      EXPECT_EQ(out.losses.total, 0.0);
      EXPECT_EQ(out.losses.aux_loss, 0.0);
      EXPECT_EQ(out.losses.z_loss, 0.0);
      EXPECT_EQ(out.losses.seq_aux_loss, 0.0);
    }
    last = out.losses;
  }
  EXPECT_EQ(last.cross_entropy, expected.cross_entropy);
  EXPECT_EQ(last.target_tokens, expected.target_tokens);
  EXPECT_EQ(last.aux_loss, expected.aux_loss);
  EXPECT_EQ(last.z_loss, expected.z_loss);
  EXPECT_EQ(last.seq_aux_loss, expected.seq_aux_loss);
  EXPECT_EQ(last.total, expected.total);
  EXPECT_GT(expected.aux_loss, 0);
  EXPECT_GT(expected.z_loss, 0);
  if (!recipe.moe().aux_loss_per_layer()) {
    const RouterStats& whole_stats = whole.model->router_stats();
    EXPECT_EQ(sums.selections, whole_stats.selections_per_expert);
    EXPECT_EQ(sums.prob_sums, whole_stats.prob_sum_per_expert);
    EXPECT_EQ(sums.tokens, whole_stats.routed_tokens);
  }

  Tensor grad;
  for (size_t i = chunks.size(); i-- > 0;) {
    grad = chunks[i].model->backward_chunk(cpu_device(), grad, 0.5f, 0, sums);
    EXPECT_EQ(grad.defined(), i > 0);
  }

  // Every parameter in exactly one chunk, under its name and unit in the whole model,
  // with the whole model's gradient.
  std::map<std::string, int> held;
  for (const Built& c : chunks) {
    for (const Param& p : c.params->params()) {
      ++held[p.name];
      Param* w = whole.params->find(p.name);
      ASSERT_NE(w, nullptr) << p.name;
      EXPECT_EQ(p.unit, w->unit) << p.name;
      EXPECT_TRUE(pipeline_test::same_bits(p.grad, w->grad)) << p.name;
    }
  }
  EXPECT_EQ(held.size(), whole.params->params().size());
  for (const auto& [name, count] : held) EXPECT_EQ(count, 1) << name;
}

class ModelChunkTest : public ::testing::TestWithParam<Case> {};

TEST_P(ModelChunkTest, ChunksGiveTheWholeModelBitForBit) {
  expect_chunks_give_the_whole_model(recipe_of(GetParam()), GetParam().documents, kChunks);
}

// A first chunk of dense layers only starts the all-layer sums at zero and passes the
// whole model's back untouched.
TEST(ModelChunk, ADenseChunkPassesTheAllLayerSumsOn) {
  config::Recipe recipe = recipe_of(pipeline_test::kCases[6]);
  ASSERT_FALSE(recipe.moe().aux_loss_per_layer());
  recipe.mutable_model()->set_first_dense_layers(2);
  expect_chunks_give_the_whole_model(recipe, false, {{0, 2}, {2, 1}, {3, 2}});
}

INSTANTIATE_TEST_SUITE_P(Models, ModelChunkTest,
                         ::testing::ValuesIn(std::begin(pipeline_test::kCases),
                                             std::end(pipeline_test::kCases)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// A stage's interleaved chunks (layers 0-1 and 3-4 here) share one ParamStore, under the
// whole model's units, and give the whole model's gradients.
TEST(ModelChunk, InterleavedChunksShareOneStore) {
  const config::Recipe recipe = recipe_of(pipeline_test::kCases[0]);
  const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(5, false);
  const Rng rng(4);
  Built whole = build(recipe, {});
  whole.model->forward(cpu_device(), mb.ids, mb.targets, /*training=*/true, rng);
  whole.model->backward(cpu_device(), 1.0f);

  ParamStore shared;
  Transformer first(recipe, shared, ModelParallel{}, {0, 2});
  Transformer last(recipe, shared, ModelParallel{}, {3, 2});
  shared.allocate(cpu_device());
  shared.initialize(5);
  pipeline_test::perturb_norms(shared);
  refresh_working_copies(cpu_device(), shared);
  Built middle = build(recipe, {2, 1});
  const Tensor h0 = first.forward_chunk(cpu_device(), Tensor(), mb.ids, mb.targets, rng).hidden;
  const Tensor h1 = middle.model->forward_chunk(cpu_device(), h0, mb.ids, mb.targets, rng).hidden;
  last.forward_chunk(cpu_device(), h1, mb.ids, mb.targets, rng);
  const Tensor g1 = last.backward_chunk(cpu_device(), Tensor(), 1.0f);
  first.backward_chunk(cpu_device(), middle.model->backward_chunk(cpu_device(), g1, 1.0f), 1.0f);
  EXPECT_EQ(shared.num_units(), kLayers + 2);
  for (const Param& p : shared.params()) {
    const Param* w = whole.params->find(p.name);
    ASSERT_NE(w, nullptr) << p.name;
    EXPECT_EQ(p.unit, w->unit) << p.name;
    EXPECT_TRUE(pipeline_test::same_bits(p.grad, w->grad)) << p.name;
  }
}

// An evaluation pass through the chunks gives the whole model's evaluation losses.
TEST(ModelChunk, EvaluationThroughTheChunks) {
  const config::Recipe recipe = recipe_of(pipeline_test::kCases[5]);
  const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(6, false);
  const Rng rng(3);
  Built whole = build(recipe, {});
  const LossParts expected =
      whole.model->forward(cpu_device(), mb.ids, mb.targets, /*training=*/false, rng);
  Tensor hidden;
  LossParts last;
  for (const ModelChunk& c : kChunks) {
    Built chunk = build(recipe, c);
    const Transformer::ChunkOutput out = chunk.model->forward_chunk(
        cpu_device(), hidden, mb.ids, mb.targets, rng, Tensor(), /*training=*/false);
    hidden = out.hidden;
    last = out.losses;
  }
  EXPECT_EQ(last.cross_entropy, expected.cross_entropy);
  EXPECT_EQ(last.target_tokens, expected.target_tokens);
}

// A stage holding two micro-batches of a middle chunk (1F1B) gives the in-order gradients.
TEST(ModelChunk, StashedMicroBatchesOfAChunk) {
  const config::Recipe recipe = recipe_of(pipeline_test::kCases[2]);
  const auto run = [&](bool interleave) {
    std::vector<Built> chunks;
    for (const ModelChunk& c : kChunks) chunks.push_back(build(recipe, c));
    Transformer& middle = *chunks[1].model;
    std::vector<Transformer::Activations> held;
    std::vector<Tensor> outputs;
    for (int micro = 0; micro < 2; ++micro) {
      const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(3 + micro, false);
      const Rng rng = Rng(8).fork(micro);
      const Tensor h0 =
          chunks[0].model->forward_chunk(cpu_device(), Tensor(), mb.ids, mb.targets, rng).hidden;
      const Tensor h1 = middle.forward_chunk(cpu_device(), h0, mb.ids, mb.targets, rng).hidden;
      chunks[2].model->forward_chunk(cpu_device(), h1, mb.ids, mb.targets, rng);
      const Tensor g2 = chunks[2].model->backward_chunk(cpu_device(), Tensor(), 0.5f);
      if (interleave) {
        held.push_back(middle.stash_activations());
        outputs.push_back(g2);
        continue;
      }
      outputs.push_back(middle.backward_chunk(cpu_device(), g2, 0.5f));
    }
    for (size_t m = 0; m < held.size(); ++m) {
      middle.restore_activations(std::move(held[m]));
      outputs[m] = middle.backward_chunk(cpu_device(), outputs[m], 0.5f);
    }
    std::vector<Tensor> grads = outputs;
    for (const Param& p : chunks[1].params->params()) grads.push_back(p.grad);
    return grads;
  };
  const std::vector<Tensor> in_order = run(false);
  const std::vector<Tensor> interleaved = run(true);
  ASSERT_EQ(in_order.size(), interleaved.size());
  for (size_t i = 0; i < in_order.size(); ++i)
    EXPECT_TRUE(pipeline_test::same_bits(in_order[i], interleaved[i])) << i;
}

// The chunks' routing statistics merged in depth order are the whole model's, totals and
// losses bit for bit, a chunk without MoE layers included.
TEST(ModelChunk, MergedRouterStatsAreTheWholeModels) {
  const config::Recipe recipe = recipe_of(pipeline_test::kCases[5]);
  const pipeline_test::MicroBatch mb = pipeline_test::micro_batch(4, false);
  const Rng rng(2);
  config::Recipe with_dense = recipe;
  with_dense.mutable_model()->set_first_dense_layers(1);
  Built whole = build(with_dense, {});
  whole.model->forward(cpu_device(), mb.ids, mb.targets, /*training=*/true, rng);
  std::vector<RouterStats> stats;
  Tensor hidden;
  for (const ModelChunk& c : std::vector<ModelChunk>{{0, 1}, {1, 3}, {4, 1}}) {
    Built chunk = build(with_dense, c);
    hidden = chunk.model->forward_chunk(cpu_device(), hidden, mb.ids, mb.targets, rng).hidden;
    stats.push_back(chunk.model->router_stats());
  }
  EXPECT_TRUE(stats[0].layers.empty());
  const RouterStats merged = RouterStats::merge(stats);
  const RouterStats& expected = whole.model->router_stats();
  ASSERT_EQ(merged.layers.size(), expected.layers.size());
  for (size_t l = 0; l < merged.layers.size(); ++l) {
    EXPECT_EQ(merged.layers[l].selections_per_expert, expected.layers[l].selections_per_expert);
    EXPECT_EQ(merged.layers[l].z_loss, expected.layers[l].z_loss);
    EXPECT_EQ(merged.layers[l].sequence_aux_loss, expected.layers[l].sequence_aux_loss);
  }
  EXPECT_EQ(merged.num_experts, expected.num_experts);
  EXPECT_EQ(merged.selections_per_expert, expected.selections_per_expert);
  EXPECT_EQ(merged.prob_sum_per_expert, expected.prob_sum_per_expert);
  EXPECT_EQ(merged.routed_tokens, expected.routed_tokens);
  EXPECT_EQ(merged.z_loss, expected.z_loss);
  EXPECT_EQ(merged.seq_aux_loss, expected.seq_aux_loss);
  EXPECT_GT(merged.seq_aux_loss, 0);
  EXPECT_EQ(merged.assignments, expected.assignments);
  EXPECT_EQ(merged.dropped_assignments, expected.dropped_assignments);
  EXPECT_GT(merged.dropped_assignments, 0);  // the capacity drops some
  EXPECT_EQ(merged.worst_load_ratio, expected.worst_load_ratio);
  EXPECT_EQ(merged.aux_loss(false), expected.aux_loss(false));
  EXPECT_EQ(merged.aux_loss(true), expected.aux_loss(true));
  EXPECT_TRUE(RouterStats::merge({}).layers.empty());
}

// Recipes take the all-layer aux loss with stages: the messages carry its sums.
TEST(ModelChunk, RecipesTakeTheAllLayerAuxLossWithStages) {
  const auto validate = [](const std::string& moe) {
    const auto recipe = config::parse_recipe(R"(
      name: "stages"
      model { vocab_size: 64 hidden_size: 16 num_layers: 4 num_heads: 4 }
      moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 12 )" +
                                                 moe + R"( }
      optimizer { lr: 1e-3 }
      train { global_batch_size: 4 micro_batch_size: 1 seq_len: 12 steps: 1 }
      data { dataset: "dataset" }
      parallel { pipeline_parallel_size: 2 }
    )",
                                             "stages");
    return recipe.ok() ? config::validate_recipe(*recipe) : recipe.status();
  };
  for (const std::string moe :
       {"aux_loss_coef: 0.01 aux_loss_per_layer: true", "", "aux_loss_coef: 0.01"})
    EXPECT_TRUE(validate(moe).ok()) << moe << ": " << validate(moe);
}

}  // namespace
}  // namespace switchyard
