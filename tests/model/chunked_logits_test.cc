// Scoring a micro-batch in row chunks (runtime.max_logits_mb) against scoring it whole:
// the same losses, the same gradients up to summation order, in f32 and bf16, and the
// chunked run never holds the whole f32 logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace switchyard {
namespace {

// 4096 tokens: one MiB holds the f32 logits of 64 rows, so a 4 x 50 micro-batch is
// scored in 4 chunks, the last one partial (64 + 64 + 64 + 8).
constexpr int64_t kVocab = 4096;
constexpr int64_t kBatch = 4, kSeq = 50;

config::Recipe recipe_with(int max_logits_mb, bool tied) {
  const std::string text = R"(
    name: "chunked-logits"
    model { vocab_size: 4096 hidden_size: 16 num_layers: 2 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 24 first_dense_layers: 1
            init_std: 0.3 tie_embeddings: )" +
                           std::string(tied ? "true" : "false") + R"( }
    moe { num_experts: 4 top_k: 2 aux_loss_coef: 0.01 z_loss_coef: 0.001
          expert_ffn_hidden_size: 12 }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 4 seq_len: 50 steps: 1 }
    runtime { max_logits_mb: )" +
                           std::to_string(max_logits_mb) +
                           R"( }
  )";
  auto recipe = config::parse_recipe(text, "chunked-logits");
  SY_CHECK(recipe.ok());
  return *recipe;
}

struct StepResult {
  LossParts loss;
  ParamStore params;
  int64_t peak_activations = 0;
};

void train_step(const config::Recipe& recipe, DType compute, StepResult& run) {
  Transformer model(recipe, run.params);
  run.params.allocate(cpu_device(), compute);
  run.params.initialize(7);
  refresh_working_copies(cpu_device(), run.params);
  Tensor ids = Tensor::empty({kBatch, kSeq}, DType::kI32);
  Tensor targets = Tensor::empty({kBatch, kSeq}, DType::kI32);
  Rng data(4);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(kVocab));
    // Some rows are not scored, one in each chunk among them.
    targets.data<int32_t>()[i] = i % 61 == 3 ? -1 : static_cast<int32_t>(data.below(kVocab));
  }
  // An evaluation-sized pass first, whose logits fit in one chunk and are kept: the
  // training pass after it must not take them for its own.
  Rng eval_rng(2);
  model.forward(cpu_device(), ids.slice_rows(0, 1), targets.slice_rows(0, 1),
                /*training=*/false, eval_rng);
  cpu_device().reset_peak_memory();
  Rng rng(1);
  run.loss = model.forward(cpu_device(), ids, targets, /*training=*/true, rng);
  model.backward(cpu_device(), 0.5f);
  run.peak_activations =
      cpu_device().memory_stats().peak_bytes[static_cast<int>(MemoryKind::kActivations)];
}

class ChunkedLogitsTest : public ::testing::TestWithParam<std::pair<DType, bool>> {};

TEST_P(ChunkedLogitsTest, MatchesWholeMicroBatch) {
  const auto [compute, tied] = GetParam();
  StepResult whole, chunked;
  train_step(recipe_with(0, tied), compute, whole);
  train_step(recipe_with(1, tied), compute, chunked);

  // Each row's loss comes from the same row products either way.
  EXPECT_EQ(chunked.loss.target_tokens, whole.loss.target_tokens);
  EXPECT_NEAR(chunked.loss.cross_entropy, whole.loss.cross_entropy,
              1e-6 * whole.loss.cross_entropy);
  EXPECT_DOUBLE_EQ(chunked.loss.aux_loss, whole.loss.aux_loss);
  EXPECT_DOUBLE_EQ(chunked.loss.z_loss, whole.loss.z_loss);

  // The LM head's gradient is summed chunk by chunk; everything upstream sees the same
  // row gradients, rounded the same way in bf16.
  const double tolerance = compute == DType::kF32 ? 1e-5 : 1e-3;
  for (size_t p = 0; p < whole.params.params().size(); ++p) {
    const Param& a = whole.params.params()[p];
    const Param& b = chunked.params.params()[p];
    ASSERT_EQ(a.name, b.name);
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < a.grad.numel(); ++i) {
      const double x = a.grad.data<float>()[i], y = b.grad.data<float>()[i];
      ASSERT_TRUE(std::isfinite(y)) << a.name << "[" << i << "]";
      scale = std::max(scale, std::abs(x));
      diff = std::max(diff, std::abs(x - y));
    }
    EXPECT_GT(scale, 0.0) << a.name;
    EXPECT_LE(diff, tolerance * scale) << a.name;
  }

  // Whole: the (200, 4096) f32 logits, 3.1 MiB, stay alive from forward to backward.
  // Chunked: one (64, 4096) chunk at a time, plus a bf16 gradient chunk in bf16.
  const int64_t whole_logits = kBatch * kSeq * kVocab * 4;
  const int64_t chunk_logits = 64 * kVocab * 4;
  EXPECT_GE(whole.peak_activations - chunked.peak_activations, whole_logits - 2 * chunk_logits)
      << "whole " << whole.peak_activations << " chunked " << chunked.peak_activations;
}

INSTANTIATE_TEST_SUITE_P(Precision, ChunkedLogitsTest,
                         ::testing::Values(std::pair{DType::kF32, false},
                                           std::pair{DType::kF32, true},
                                           std::pair{DType::kBF16, false}));

}  // namespace
}  // namespace switchyard
