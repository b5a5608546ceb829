#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/cross_entropy.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_integers;
using testing::random_vector;
using testing::values_of;

constexpr int64_t kRows = 9, kVocab = 37;

// NaN everywhere, so an element the op does not write fails the comparison.
Tensor nan_filled(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::nanf(""));
  return t;
}

// Random targets with rows 2 and 5 ignored.
std::vector<int32_t> make_targets(uint64_t seed) {
  auto targets = random_integers<int32_t>(kRows, seed, 0, kVocab - 1);
  targets[2] = -1;
  targets[5] = -100;
  return targets;
}

// Naive per-row loss: log(sum exp(x)) - x[target], computed with long double.
std::vector<double> naive_losses(const std::vector<double>& logits,
                                 const std::vector<int32_t>& targets) {
  std::vector<double> losses(kRows, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    if (targets[r] < 0) continue;
    long double sum = 0;
    for (int64_t j = 0; j < kVocab; ++j)
      sum += std::exp(static_cast<long double>(logits[r * kVocab + j]));
    losses[r] = static_cast<double>(std::log(sum) - logits[r * kVocab + targets[r]]);
  }
  return losses;
}

TEST(CrossEntropyTest, ForwardMatchesNaive) {
  const auto logits = random_vector<double>(kRows * kVocab, 1, -4, 4);
  const auto targets = make_targets(2);
  std::vector<double> losses(kRows), lse(kRows);
  cpu::cross_entropy_forward<double>(logits.data(), targets.data(), kRows, kVocab, losses.data(),
                                     lse.data());
  EXPECT_LT(max_relative_error(losses, naive_losses(logits, targets)), 1e-13);
  EXPECT_EQ(losses[2], 0.0);
  EXPECT_EQ(losses[5], 0.0);
  EXPECT_TRUE(any_nonzero(losses));
}

TEST(CrossEntropyTest, StableForLargeLogits) {
  // exp(1000) overflows even a double; the shifted form must stay exact.
  auto logits = random_vector<float>(kRows * kVocab, 5, -4, 4);
  for (auto& x : logits) x += 1000.0f;
  const auto targets = make_targets(6);
  std::vector<double> shifted(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) shifted[i] = static_cast<double>(logits[i]) - 1000.0;
  const auto expected = naive_losses(shifted, targets);

  Tensor tlogits = host_tensor<float>({kRows, kVocab}, logits), ttargets = host_tensor<int32_t>(targets);
  Tensor losses = Tensor::empty({kRows}), lse = Tensor::empty({kRows});
  cross_entropy_forward(cpu_device(), tlogits, ttargets, losses, lse);
  // Float logits near 1000 carry an absolute rounding of ~3e-5.
  EXPECT_LT(max_relative_error(values_of<float>(losses), expected), 1e-4);
  Tensor dlogits = Tensor::empty({kRows, kVocab});
  cross_entropy_backward(cpu_device(), tlogits, ttargets, lse, 1.0f, dlogits);
  for (float d : values_of<float>(dlogits)) EXPECT_TRUE(std::isfinite(d));
  EXPECT_TRUE(any_nonzero(values_of<float>(dlogits)));
}

TEST(CrossEntropyTest, VocabularyShardsCombineIntoTheWholeLoss) {
  // Two shards of 20 and 17 columns (kVocab = 37, uneven on purpose): the combined
  // log-sum-exp and target logits give the whole forward's losses, and each shard's
  // backward with the whole lse gives its columns of the whole gradient.
  const auto logits = random_vector<float>(kRows * kVocab, 11, -4, 4);
  const auto targets = make_targets(12);
  const float scale = 0.5f;
  Tensor tlogits = host_tensor<float>({kRows, kVocab}, logits), ttargets = host_tensor<int32_t>(targets);
  Tensor losses = Tensor::empty({kRows}), lse = Tensor::empty({kRows});
  cross_entropy_forward(cpu_device(), tlogits, ttargets, losses, lse);
  Tensor dwhole = Tensor::empty({kRows, kVocab});
  cross_entropy_backward(cpu_device(), tlogits, ttargets, lse, scale, dwhole);

  const int64_t starts[] = {0, 20, kVocab};
  std::vector<double> sum_exp(kRows, 0.0), target_logit(kRows, 0.0);
  std::vector<Tensor> shards;
  for (int s = 0; s < 2; ++s) {
    const int64_t width = starts[s + 1] - starts[s];
    Tensor shard = Tensor::empty({kRows, width});
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < width; ++j)
        shard.data<float>()[r * width + j] = logits[r * kVocab + starts[s] + j];
    Tensor shard_lse = Tensor::empty({kRows}), shard_target = nan_filled({kRows});
    cross_entropy_shard_forward(cpu_device(), shard, ttargets, {starts[s], kVocab}, shard_lse,
                                shard_target);
    for (int64_t r = 0; r < kRows; ++r) {
      sum_exp[r] += std::exp(static_cast<double>(shard_lse.data<float>()[r]));
      target_logit[r] += shard_target.data<float>()[r];
    }
    shards.push_back(shard);
  }
  for (int64_t r = 0; r < kRows; ++r) {
    const double combined_lse = std::log(sum_exp[r]);
    EXPECT_NEAR(combined_lse, lse.data<float>()[r], 1e-5);
    const double loss = targets[r] < 0 ? 0.0 : combined_lse - target_logit[r];
    EXPECT_NEAR(loss, losses.data<float>()[r], 1e-5);
  }
  for (int s = 0; s < 2; ++s) {
    const int64_t width = starts[s + 1] - starts[s];
    Tensor dshard = nan_filled({kRows, width});
    cross_entropy_backward(cpu_device(), shards[s], ttargets, lse, scale, dshard,
                           {starts[s], kVocab});
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < width; ++j)
        EXPECT_FLOAT_EQ(dshard.data<float>()[r * width + j],
                        dwhole.data<float>()[r * kVocab + starts[s] + j]);
  }
}

// A bf16 dlogits gets the f32 gradient rounded once, for the whole vocabulary and for
// a shard; the logits stay f32 and untouched.
TEST(CrossEntropyTest, Bf16GradientIsTheF32GradientRounded) {
  const auto logits = random_vector<float>(kRows * kVocab, 13, -4, 4);
  const auto targets = make_targets(14);
  const float scale = 0.37f;
  Tensor tlogits = host_tensor<float>({kRows, kVocab}, logits), ttargets = host_tensor<int32_t>(targets);
  Tensor losses = Tensor::empty({kRows}), lse = Tensor::empty({kRows});
  cross_entropy_forward(cpu_device(), tlogits, ttargets, losses, lse);
  for (const VocabShard shard : {VocabShard{}, VocabShard{5, kVocab + 11}}) {
    SCOPED_TRACE(::testing::Message() << "shard start " << shard.start);
    Tensor d32 = nan_filled({kRows, kVocab});
    cross_entropy_backward(cpu_device(), tlogits, ttargets, lse, scale, d32, shard);
    Tensor d16 = Tensor::empty({kRows, kVocab}, DType::kBF16);
    std::fill(d16.data<bf16>(), d16.data<bf16>() + d16.numel(), bf16{0x7FC0});  // NaN
    cross_entropy_backward(cpu_device(), tlogits, ttargets, lse, scale, d16, shard);
    for (int64_t i = 0; i < kRows * kVocab; ++i)
      EXPECT_EQ(d16.data<bf16>()[i].bits, to_bf16(d32.data<float>()[i]).bits) << i;
    EXPECT_TRUE(any_nonzero(values_of<float>(d32)));
    EXPECT_EQ(values_of<float>(tlogits), logits);
  }
}

TEST(CrossEntropyDeathTest, WrongDtypesAreRefused) {
  const Tensor ttargets = host_tensor<int32_t>(make_targets(15));
  const Tensor lse = Tensor::zeros({kRows});
  const Tensor logits16 = Tensor::zeros({kRows, kVocab}, DType::kBF16);
  Tensor d16 = Tensor::zeros({kRows, kVocab}, DType::kBF16);
  EXPECT_DEATH(cross_entropy_backward(cpu_device(), logits16, ttargets, lse, 1.0f, d16),
               "logits must be f32");
  Tensor losses = Tensor::zeros({kRows}), lse_out = Tensor::zeros({kRows});
  EXPECT_DEATH(cross_entropy_forward(cpu_device(), logits16, ttargets, losses, lse_out),
               "logits must be f32");
  const Tensor logits = Tensor::zeros({kRows, kVocab});
  Tensor di = Tensor::zeros({kRows, kVocab}, DType::kI32);
  EXPECT_DEATH(cross_entropy_backward(cpu_device(), logits, ttargets, lse, 1.0f, di),
               "dlogits must be f32 or bf16");
}

}  // namespace
}  // namespace switchyard
