// The memory plan of `train --dry-run`, `plan` and the trainer's fit check: every rank of
// a layout from the shards it registers and the step's shapes, without allocating.
#include "engine/train/memory_plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/zero.h"
#include "engine/train/evaluation.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();
constexpr double kMiB = 1 << 20;

config::Recipe tiny(const std::vector<std::string>& overrides) {
  absl::StatusOr<config::Recipe> recipe =
      config::load_recipe((kRoot / "recipes/tiny.textproto").string(), overrides);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

std::vector<RankMemory> plan(const config::Recipe& recipe, int world) {
  absl::StatusOr<Layout> layout = make_layout(recipe, world);
  if (!layout.ok()) ADD_FAILURE() << layout.status();
  if (!layout.ok()) return {};
  return plan_rank_memory(recipe, *layout, DType::kF32);
}

TEST(MemoryPlanTest, OneRankHoldsEveryParameterGradientAndAdamMoment) {
  const std::vector<RankMemory> ranks = plan(tiny({}), 1);
  ASSERT_EQ(ranks.size(), 1u);
  // 3,609,728 fp32 parameters: values and gradients 4 bytes each, AdamW's moments 8.
  EXPECT_EQ(ranks[0].parameters, 3609728.0 * 4);
  EXPECT_EQ(ranks[0].gradients, 3609728.0 * 4);
  EXPECT_EQ(ranks[0].optimizer_state, 3609728.0 * 8);
  EXPECT_EQ(ranks[0].working_copies, 0);
  EXPECT_EQ(ranks[0].gradient_buckets, 0);
  EXPECT_EQ(ranks[0].all_to_all, 0);
}

// The activation peak of one micro-batch (8 x 128 tokens, hidden 128, 4 MoE layers of 8
// experts top-2 with hidden 256, vocabulary 1024, fp32), counted by hand from the
// model's allocations: it falls in the last layer's MoE backward.
TEST(MemoryPlanTest, ActivationPeakIsTheLastLayersMoeBackwardOverEverySavedTensor) {
  const double n = 8 * 128, x = n * 128 * 4, rows = n * 2;
  const double attention = n * (2 * 128 + 2 * 64) * 4 + n * 4 * 4;
  const double routing = 2 * n * 8 * 4 + 3 * n * 2 * 4 + 8 * 4;
  const double experts = rows * (128 + 3 * 256 + 128) * 4;
  const double layer = 4 * x + 2 * n * 4 + attention + routing + experts;
  const double stem = 8 * n + 128 * 32 * 4;
  const double moe_backward = x + rows * 128 * 4 + n * 2 * 4 + rows * (3 * 256 + 128) * 4 +
                              n * 8 * 4;
  const double peak = stem + 4 * layer + x + 4 * 8 * 4 + moe_backward;
  EXPECT_EQ(plan(tiny({}), 1)[0].activations, peak);
}

// Recomputation: SELECTIVE keeps every layer but attention's core and the experts'
// intermediates, which the last layer's MoE backward holds again; FULL keeps each
// recomputed layer's input, and the last layer's backward holds all of it again.
TEST(MemoryPlanTest, RecomputationKeepsLessUntilEachLayersBackward) {
  const double n = 8 * 128, x = n * 128 * 4, rows = n * 2;
  const double attention = n * (2 * 128 + 2 * 64) * 4 + n * 4 * 4;
  const double core = n * 128 * 4 + n * 4 * 4;
  const double routing = 2 * n * 8 * 4 + 3 * n * 2 * 4 + 8 * 4;
  const double hidden = rows * 3 * 256 * 4;
  const double experts = rows * (128 + 3 * 256 + 128) * 4;
  const double layer = 4 * x + 2 * n * 4 + attention + routing + experts;
  const double stem = 8 * n + 128 * 32 * 4;
  const double moe_backward = x + rows * 128 * 4 + n * 2 * 4 + rows * (3 * 256 + 128) * 4 +
                              n * 8 * 4;
  const double flowing = x + 4 * 8 * 4;
  EXPECT_EQ(plan(tiny({"train.recompute=SELECTIVE"}), 1)[0].activations,
            stem + 4 * (layer - core - hidden) + hidden + flowing + moe_backward);
  EXPECT_EQ(plan(tiny({"train.recompute=FULL"}), 1)[0].activations,
            stem + 3 * x + layer + flowing + moe_backward);
  EXPECT_EQ(plan(tiny({"train.recompute=FULL", "train.recompute_layers=2"}), 1)[0].activations,
            stem + 2 * x + 2 * layer + flowing + moe_backward);
}

TEST(MemoryPlanTest, ActivationsGrowWithTheMicroBatchAndShrinkUnderTensorParallelism) {
  const double one = plan(tiny({"train.micro_batch_size=4"}), 1)[0].activations;
  const double two = plan(tiny({"train.micro_batch_size=8"}), 1)[0].activations;
  EXPECT_GT(two, 1.8 * one);
  const double tp = plan(tiny({"parallel.tensor_parallel_size=2"}), 2)[0].activations;
  EXPECT_LT(tp, two);
}

TEST(MemoryPlanTest, ExpertParallelRanksHoldAllToAllBuffers) {
  const config::Recipe recipe = tiny({"parallel.expert_parallel_size=2"});
  const std::vector<RankMemory> ranks = plan(recipe, 2);
  ASSERT_EQ(ranks.size(), 2u);
  // The backward's exchange back to the routing ranks, sent and received: 2 x (tokens x
  // top-2) rows of hidden 128.
  EXPECT_EQ(ranks[0].all_to_all, 2.0 * (8 * 128 * 2) * 128 * 4);
}

TEST(MemoryPlanTest, ExpertParallelRanksEachHoldTheirShareOfTheExperts) {
  const config::Recipe recipe = tiny({"parallel.expert_parallel_size=4", "train.micro_batch_size=4"});
  const std::vector<RankMemory> ranks = plan(recipe, 4);
  ASSERT_EQ(ranks.size(), 4u);
  const double dense = 3609728.0 - 3145728.0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].rank, r);
    EXPECT_EQ(ranks[r].ep_index, r);
    EXPECT_EQ(ranks[r].parameters, (dense + 3145728.0 / 4) * 4);
    EXPECT_EQ(ranks[r].gradients, (dense + 3145728.0 / 4) * 4);
  }
}

TEST(MemoryPlanTest, ZeroStagesShardDenseGradientsAndValues) {
  const RankMemory one = plan(tiny({"parallel.zero_stage=1"}), 2)[0];
  const RankMemory two = plan(tiny({"parallel.zero_stage=2"}), 2)[0];
  const RankMemory three = plan(tiny({"parallel.zero_stage=3"}), 2)[0];
  EXPECT_LT(two.gradients, one.gradients);
  EXPECT_LT(three.parameters, two.parameters);
  EXPECT_LT(one.optimizer_state, plan(tiny({}), 2)[0].optimizer_state);
  // Whole-layer gradients are reduce-scattered from buckets; ZeRO-3 gathers a layer.
  EXPECT_EQ(one.gradient_buckets, 0);
  EXPECT_GT(two.gradient_buckets, 0);
  EXPECT_GT(three.working_copies, 0);
}

TEST(MemoryPlanTest, ZeroOneGivesEachParametersStateToOneOwner) {
  const std::vector<RankMemory> ranks = plan(tiny({"parallel.zero_stage=1"}), 2);
  const double whole = plan(tiny({}), 2)[0].optimizer_state;
  EXPECT_EQ(ranks[0].optimizer_state + ranks[1].optimizer_state, whole);
  EXPECT_GT(ranks[0].optimizer_state, 0);
  EXPECT_GT(ranks[1].optimizer_state, 0);
}

// A frozen parameter (train.freeze) has no AdamW moments and, as a ZeRO-2/3 row shard,
// no gradient rows; its value is kept.
TEST(MemoryPlanTest, FrozenParameterHasNoStateOrGradientRows) {
  for (int stage : {0, 2, 3}) {
    const config::Recipe recipe = tiny({"parallel.zero_stage=" + std::to_string(stage)});
    auto memory = [&](bool freeze) {
      ParamStore params;
      const Transformer model(recipe, params);
      Param* q = params.find("model.layers.0.self_attn.q_proj.weight");
      q->trainable = !freeze;
      if (stage >= 2)
        for (Param& p : params.params()) mark_zero_residency(p, stage);
      return rank_memory_lower_bound(recipe, params, DType::kF32, 1);
    };
    const RankMemory all = memory(false), frozen = memory(true);
    const double q = 128.0 * 128;
    EXPECT_EQ(all.optimizer_state - frozen.optimizer_state, 8 * q) << stage;
    EXPECT_EQ(all.gradients - frozen.gradients, stage >= 2 ? 4 * q : 0) << stage;
    EXPECT_EQ(all.parameters, frozen.parameters) << stage;
  }
}

// Pipeline stages hold their own layers: the first the embedding, the last the final
// norm and head (the tiny model's 4 layers, 2 a stage, or as parallel.pipeline_layers
// splits them), with their gradients and AdamW moments; together the whole model.
TEST(MemoryPlanTest, PipelineStagesHoldTheirOwnLayers) {
  const std::vector<RankMemory> even = plan(tiny({"parallel.pipeline_parallel_size=2"}), 2);
  ASSERT_EQ(even.size(), 2u);
  EXPECT_EQ(even[0].pp_index, 0);
  EXPECT_EQ(even[1].pp_index, 1);
  EXPECT_EQ(even[0].parameters + even[1].parameters, 3609728.0 * 4);
  EXPECT_EQ(even[1].parameters - even[0].parameters, 128.0 * 4);  // the final norm
  EXPECT_EQ(even[0].optimizer_state + even[1].optimizer_state, 3609728.0 * 8);
  config::Recipe three_one = tiny({"parallel.pipeline_parallel_size=2"});
  three_one.mutable_parallel()->add_pipeline_layers(3);
  three_one.mutable_parallel()->add_pipeline_layers(1);
  const std::vector<RankMemory> uneven = plan(three_one, 2);
  ASSERT_EQ(uneven.size(), 2u);
  const double layer = (3609728.0 - 2 * 131072 - 128) / 4;
  EXPECT_EQ(uneven[0].parameters, (131072 + 3 * layer) * 4);
  EXPECT_EQ(uneven[1].parameters, (layer + 128 + 131072) * 4);
}

// train.recompute_layers counts the layers of each chunk: with 2 stages of 2 layers,
// recompute_layers 1 keeps only the input of layer 0 on the first stage and of layer 2 on
// the second, so both stages hold less than without recomputation (counted from the
// model's first layer, the second stage would recompute nothing).
TEST(MemoryPlanTest, RecomputeLayersCountsEachStagesLayers) {
  const std::vector<std::string> two = {"parallel.pipeline_parallel_size=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), two.begin(), two.end());
    return plan(tiny(more), 2);
  };
  const std::vector<RankMemory> none = with({});
  const std::vector<RankMemory> first = with({"train.recompute=FULL", "train.recompute_layers=1"});
  ASSERT_EQ(first.size(), 2u);
  for (int stage : {0, 1}) {
    EXPECT_LT(first[stage].activations, none[stage].activations) << stage;
  }
}

// The trainer's check: a stage's chunk registers only its layers, and the plan finds its
// stage from them (the second of 2 stages: layers 2 and 3, the final norm and head).
TEST(MemoryPlanTest, AChunksParametersTellItsStage) {
  const config::Recipe recipe = tiny({"parallel.pipeline_parallel_size=2"});
  ParamStore params;
  const Transformer model(recipe, params, {}, ModelChunk{2, 2});
  const RankMemory chunk = rank_memory_lower_bound(recipe, params, DType::kF32, 1);
  const RankMemory planned = plan(recipe, 2)[1];
  EXPECT_EQ(chunk.pp_index, 1);
  EXPECT_EQ(chunk.parameters, planned.parameters);
  EXPECT_EQ(chunk.activations, planned.activations);
  EXPECT_EQ(chunk.pipeline_buffers, planned.pipeline_buffers);
}

// 1F1B holds at most P micro-batches' activations on the first stage where GPipe holds
// all m: the tiny model on 4 stages of one layer each, 8 micro-batches of 2 x 128
// tokens. Stage 0's peak is its last micro-batch's backward over the stashes of the
// others in flight (3 under 1F1B, 7 under GPipe), each the layer's saved tensors as
// counted by hand above; the last stage holds one micro-batch under 1F1B.
TEST(MemoryPlanTest, OneFOneBHoldsAtMostPMicroBatchesOnTheFirstStage) {
  // No evaluation: its batch of 8 windows would be the single micro-batch's peak.
  const std::vector<std::string> four = {"parallel.pipeline_parallel_size=4",
                                         "train.micro_batch_size=2", "train.eval_interval=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), four.begin(), four.end());
    return plan(tiny(more), 4);
  };
  const std::vector<RankMemory> one_f_one_b = with({});
  const std::vector<RankMemory> gpipe = with({"parallel.pipeline_schedule=GPIPE"});
  const std::vector<RankMemory> single = with({"train.global_batch_size=2"});
  ASSERT_EQ(one_f_one_b.size(), 4u);
  const double n = 2 * 128, x = n * 128 * 4, rows = n * 2;
  const double attention = n * (2 * 128 + 2 * 64) * 4 + n * 4 * 4;
  const double routing = 2 * n * 8 * 4 + 3 * n * 2 * 4 + 8 * 4;
  const double experts = rows * (128 + 3 * 256 + 128) * 4;
  const double layer = 4 * x + 2 * n * 4 + attention + routing + experts;
  EXPECT_EQ(one_f_one_b[0].activations, single[0].activations + 3 * layer);
  EXPECT_EQ(gpipe[0].activations, single[0].activations + 7 * layer);
  EXPECT_EQ(one_f_one_b[3].activations, single[3].activations);
  // Below the last stage, backward starts from the gradient the next stage sent.
  EXPECT_EQ(one_f_one_b[0].pipeline_buffers, x);
  EXPECT_EQ(one_f_one_b[3].pipeline_buffers, 0);
}

// Interleaved 1F1B (4 stages, 2 chunks of one layer each) holds its warm-up's chunk
// passes plus one on stage 0: 2(P - 1) + (V - 1)P + 1 = 11 of the 16 over a step.
TEST(MemoryPlanTest, InterleavedStagesHoldTheirWarmUpChunkPasses) {
  const std::vector<RankMemory> ranks =
      plan(tiny({"parallel.pipeline_parallel_size=4", "parallel.virtual_pipeline_size=2",
                 "model.num_layers=8", "train.micro_batch_size=2"}),
           4);
  const std::vector<RankMemory> single =
      plan(tiny({"parallel.pipeline_parallel_size=4", "parallel.virtual_pipeline_size=2",
                 "model.num_layers=8", "train.micro_batch_size=2",
                 "train.global_batch_size=8"}),
           4);
  const double n = 2 * 128, x = n * 128 * 4, rows = n * 2;
  const double attention = n * (2 * 128 + 2 * 64) * 4 + n * 4 * 4;
  const double routing = 2 * n * 8 * 4 + 3 * n * 2 * 4 + 8 * 4;
  const double experts = rows * (128 + 3 * 256 + 128) * 4;
  const double layer = 4 * x + 2 * n * 4 + attention + routing + experts;
  // 4 micro-batches hold min(4 x 2, 11) = 8 chunk passes; 8 hold 11.
  EXPECT_EQ(ranks[0].activations - single[0].activations, 3 * layer);
}

// An evaluation forward holds up to 8 windows and 4096 tokens (one window at least), the
// windows eval_tokens asks for at most.
TEST(MemoryPlanTest, AnEvaluationBatchHoldsAtMost4096Tokens) {
  EXPECT_EQ(evaluation_batch_windows(128, int64_t{1} << 20), 8);
  EXPECT_EQ(evaluation_batch_windows(1024, int64_t{1} << 20), 4);
  EXPECT_EQ(evaluation_batch_windows(4096, int64_t{1} << 20), 1);
  EXPECT_EQ(evaluation_batch_windows(8192, int64_t{1} << 20), 1);
  EXPECT_EQ(evaluation_batch_windows(128, 200), 2);
}

// The plan counts the evaluation's forward where it is the peak: 8 windows of 128 tokens
// against a micro-batch of one. A 4096-token window goes alone, and its forward, one layer
// at a time, stays under the training step's micro-batch of one such window.
TEST(MemoryPlanTest, TheEvaluationForwardIsThePeakOnlyWhereItsBatchIsLarger) {
  auto activations = [](std::vector<std::string> more, bool evaluates) {
    more.push_back("train.micro_batch_size=1");
    more.push_back(evaluates ? "train.eval_interval=100" : "train.eval_interval=0");
    return plan(tiny(more), 1)[0].activations;
  };
  EXPECT_GT(activations({}, true), activations({}, false));
  EXPECT_EQ(activations({"train.seq_len=4096"}, true), activations({"train.seq_len=4096"}, false));
}

TEST(MemoryPlanTest, BfloatAddsWorkingCopiesAndHalvesActivations) {
  const RankMemory f32 = plan(tiny({}), 1)[0];
  absl::StatusOr<Layout> layout = make_layout(tiny({}), 1);
  ASSERT_TRUE(layout.ok());
  const RankMemory bf16 = plan_rank_memory(tiny({}), *layout, DType::kBF16)[0];
  EXPECT_EQ(bf16.parameters, f32.parameters);
  EXPECT_GT(bf16.working_copies, 0.45 * f32.parameters);
  EXPECT_LT(bf16.activations, 0.7 * f32.activations);
}

TEST(MemoryPlanTest, DescribesARankInOneLine) {
  RankMemory m;
  m.rank = 3;
  m.ep_index = 3;
  m.parameters = 64.0 * (1 << 30);
  m.optimizer_state = 8 * kMiB;
  m.activations = 2 * kMiB;
  EXPECT_EQ(describe_rank_memory(m),
            "rank 3 (stage 0, tp 0, ep 3): at least 64.01 GiB: parameters 64.00 GiB, working "
            "copies 0.0 MiB, gradients 0.0 MiB, gradient buckets 0.0 MiB, optimizer state 8.0 "
            "MiB, activations 2.0 MiB, all-to-all buffers 0.0 MiB, pipeline buffers 0.0 MiB");
}

TEST(MemoryPlanTest, WarnsOnlyWhenTheNeedFitsWithLessThanATenthToSpare) {
  EXPECT_EQ(tight_fit_warning("cuda:0", 70 * kMiB, 80 * kMiB), "");
  EXPECT_EQ(tight_fit_warning("cuda:0", 90 * kMiB, 80 * kMiB), "");  // check_fits refuses it
  EXPECT_EQ(tight_fit_warning("cuda:0", 76 * kMiB, -1), "");
  EXPECT_EQ(tight_fit_warning("cuda:0", 76 * kMiB, 80 * kMiB),
            "warning: this run needs at least 76.0 MiB on cuda:0, 95% of the 80.0 MiB available "
            "there; routing imbalance, workspaces and fragmentation may not fit (use a smaller "
            "micro-batch, or more ranks)");
}

}  // namespace
}  // namespace switchyard
