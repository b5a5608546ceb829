// CUDA cross-entropy (whole vocabulary and vocabulary shard) against its CPU twin, with
// f32 gradients (in place too) and bf16 ones.
#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::host_tensor;
using testing::poisoned;
using testing::random_integers;
using testing::random_tensor;
using testing::random_vector;
using testing::to_device;
using testing::values_of;

constexpr double kTol = 1e-5;
constexpr float kScale = 0.37f;

// Targets for logits holding columns [first, last] of a vocabulary of `whole` ids: most
// in those columns, every fifth row anywhere in the vocabulary (for a shard, mostly
// outside it), every seventh ignored (-1 or -100); the last row aims at the last column.
Tensor make_targets(int64_t n, int64_t first, int64_t last, int64_t whole, uint64_t seed) {
  std::vector<int32_t> t =
      random_integers<int32_t>(n, seed, static_cast<int>(first), static_cast<int>(last));
  const std::vector<int32_t> any =
      random_integers<int32_t>(n, seed + 1, 0, static_cast<int>(whole - 1));
  for (int64_t r = 4; r < n; r += 5) t[r] = any[r];
  for (int64_t r = 3; r < n; r += 7) t[r] = r % 2 ? -1 : -100;
  if (n > 0) t[n - 1] = static_cast<int32_t>(last);
  return host_tensor({n}, t);
}

// The backward on the GPU into a poisoned tensor and in place (dlogits aliasing the
// logits, as the model runs it), both against the CPU's `expected`. Both backends take
// the same lse, so the comparison sees the gradient kernel alone.
void expect_backward_matches(CudaDevice& gpu, const Tensor& logits, const Tensor& targets,
                             const Tensor& lse, VocabShard shard, const Tensor& expected,
                             double tol) {
  const Tensor gtargets = to_device(gpu, targets), glse = to_device(gpu, lse);
  Tensor gdlogits = poisoned(gpu, logits.shape());
  cross_entropy_backward(gpu, to_device(gpu, logits), gtargets, glse, kScale, gdlogits, shard);
  EXPECT_TRUE(all_close(gdlogits, expected, tol));
  Tensor ginplace = to_device(gpu, logits);
  cross_entropy_backward(gpu, ginplace, gtargets, glse, kScale, ginplace, shard);
  EXPECT_TRUE(all_close(ginplace, expected, tol));
}

// The backward into a poisoned bf16 gradient on both backends (from the same f32 logits
// and lse): the f32 gradients agree to f32 rounding, so the bf16 ones to one bf16 rounding.
void expect_bf16_backward_matches(CudaDevice& gpu, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, VocabShard shard) {
  Tensor dlogits = Tensor::empty(logits.shape(), DType::kBF16);
  cross_entropy_backward(cpu_device(), logits, targets, lse, kScale, dlogits, shard);
  Tensor gdlogits = poisoned(gpu, logits.shape(), DType::kBF16);
  cross_entropy_backward(gpu, to_device(gpu, logits), to_device(gpu, targets), to_device(gpu, lse),
                         kScale, gdlogits, shard);
  EXPECT_TRUE(all_close(gdlogits, dlogits, 1.0 / 128));
}

struct Case {
  int64_t rows;
  int64_t vocab;
};

TEST(CrossEntropyGpu, ForwardAndBackwardMatchCpu) {
  CudaDevice gpu(0);
  std::vector<Case> cases;
  // Vocabularies below and far above the block size (256), GPT-2's included.
  for (int64_t rows : {1, 7, 300})
    for (int64_t vocab : {1, 33, 1000, 50257}) cases.push_back({rows, vocab});
  // More rows than one grid of blocks (some blocks take two), and no rows at all.
  cases.push_back({70001, 5});
  cases.push_back({0, 33});
  for (const Case c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, vocab " << c.vocab);
    const Tensor logits = random_tensor({c.rows, c.vocab}, 1, -4.0, 4.0);
    const Tensor targets = make_targets(c.rows, 0, c.vocab - 1, c.vocab, 2);
    Tensor losses = Tensor::empty({c.rows}), lse = Tensor::empty({c.rows});
    cross_entropy_forward(cpu_device(), logits, targets, losses, lse);
    Tensor glosses = poisoned(gpu, {c.rows}), glse = poisoned(gpu, {c.rows});
    cross_entropy_forward(gpu, to_device(gpu, logits), to_device(gpu, targets), glosses, glse);
    EXPECT_TRUE(all_close(glosses, losses, kTol));
    EXPECT_TRUE(all_close(glse, lse, kTol));

    Tensor dlogits = Tensor::empty({c.rows, c.vocab});
    cross_entropy_backward(cpu_device(), logits, targets, lse, kScale, dlogits);
    expect_backward_matches(gpu, logits, targets, lse, {}, dlogits, kTol);
    expect_bf16_backward_matches(gpu, logits, targets, lse, {});
  }
}

struct ShardCase {
  int64_t rows;
  int64_t start;
  int64_t width;
  int64_t whole;
};

TEST(CrossEntropyGpu, VocabularyShardMatchesCpu) {
  CudaDevice gpu(0);
  for (const ShardCase c : {ShardCase{7, 17, 33, 100}, ShardCase{300, 24000, 1000, 50257},
                            ShardCase{300, 50000, 257, 50257}, ShardCase{5, 49, 1, 50}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, columns " << c.start << " + " << c.width
                                      << " of " << c.whole);
    const VocabShard shard{c.start, c.whole};
    const Tensor logits = random_tensor({c.rows, c.width}, 3, -4.0, 4.0);
    std::vector<int32_t> ids =
        values_of<int32_t>(make_targets(c.rows, c.start, c.start + c.width - 1, c.whole, 4));
    // Targets just before and just after the shard's columns, where the vocabulary has them.
    ids[1] = static_cast<int32_t>(c.start - 1);
    if (c.start + c.width < c.whole) ids[2] = static_cast<int32_t>(c.start + c.width);
    const Tensor targets = host_tensor({c.rows}, ids);

    Tensor lse = Tensor::empty({c.rows}), target_logits = Tensor::empty({c.rows});
    cross_entropy_shard_forward(cpu_device(), logits, targets, shard, lse, target_logits);
    Tensor glse = poisoned(gpu, {c.rows}), gtarget_logits = poisoned(gpu, {c.rows});
    cross_entropy_shard_forward(gpu, to_device(gpu, logits), to_device(gpu, targets), shard, glse,
                                gtarget_logits);
    EXPECT_TRUE(all_close(glse, lse, kTol));
    // A copied logit or 0: exact.
    EXPECT_TRUE(all_equal(gtarget_logits, target_logits));

    // The backward takes the whole vocabulary's lse: this shard's plus the other shards'.
    std::vector<float> whole_lse = values_of<float>(lse);
    for (float& v : whole_lse) v += 1.5f;
    const Tensor whole = host_tensor({c.rows}, whole_lse);
    Tensor dlogits = Tensor::empty({c.rows, c.width});
    cross_entropy_backward(cpu_device(), logits, targets, whole, kScale, dlogits, shard);
    expect_backward_matches(gpu, logits, targets, whole, shard, dlogits, kTol);
    expect_bf16_backward_matches(gpu, logits, targets, whole, shard);
  }
}

TEST(CrossEntropyGpu, LargeAndMaskedLogitsMatchCpu) {
  // Logits near 1000 (exp would overflow unshifted) whose first 300 columns are -inf, as
  // masked columns are: every thread's first logit is -inf, and some threads' second.
  CudaDevice gpu(0);
  const int64_t rows = 7, vocab = 1000, masked = 300;
  std::vector<float> values = random_vector<float>(rows * vocab, 5, 996.0, 1004.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < masked; ++j) values[r * vocab + j] = -INFINITY;
  const Tensor logits = host_tensor({rows, vocab}, values);
  std::vector<int32_t> ids = random_integers<int32_t>(rows, 6, masked, vocab - 1);
  ids[3] = -1;
  const Tensor targets = host_tensor({rows}, ids);
  // An lse near 1009 carries a rounding of 6e-5, which the losses inherit.
  const double tol = 1e-4;

  Tensor losses = Tensor::empty({rows}), lse = Tensor::empty({rows});
  cross_entropy_forward(cpu_device(), logits, targets, losses, lse);
  Tensor glosses = poisoned(gpu, {rows}), glse = poisoned(gpu, {rows});
  cross_entropy_forward(gpu, to_device(gpu, logits), to_device(gpu, targets), glosses, glse);
  EXPECT_TRUE(all_close(glosses, losses, tol));
  EXPECT_TRUE(all_close(glse, lse, tol));
  EXPECT_TRUE(testing::any_nonzero(glosses));

  Tensor dlogits = Tensor::empty({rows, vocab});
  cross_entropy_backward(cpu_device(), logits, targets, lse, kScale, dlogits);
  expect_backward_matches(gpu, logits, targets, lse, {}, dlogits, tol);
  expect_bf16_backward_matches(gpu, logits, targets, lse, {});
}

TEST(CrossEntropyGpuDeathTest, TargetPastTheVocabularyTraps) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the parent holds a CUDA context
  CudaDevice gpu(0);
  const int64_t rows = 3, width = 33;
  const Tensor glogits = to_device(gpu, random_tensor({rows, width}, 7));
  Tensor gout = poisoned(gpu, {rows}), glse = poisoned(gpu, {rows});  // per-row outputs
  Tensor gdlogits = poisoned(gpu, {rows, width});
  // The kernel traps (its message goes to stdout); the next checked CUDA call aborts.
  const Tensor past_vocab = to_device(gpu, host_tensor({rows}, std::vector<int32_t>{0, 33, 1}));
  EXPECT_DEATH(
      {
        cross_entropy_forward(gpu, glogits, past_vocab, gout, glse);
        gpu.synchronize();
      },
      "CHECK\\(cuda");
  // In a shard of columns [17, 50) of 100, target 99 is valid; 100 is past the vocabulary.
  const VocabShard shard{17, 100};
  const Tensor past_whole = to_device(gpu, host_tensor({rows}, std::vector<int32_t>{99, 5, 100}));
  EXPECT_DEATH(
      {
        cross_entropy_shard_forward(gpu, glogits, past_whole, shard, glse, gout);
        gpu.synchronize();
      },
      "CHECK\\(cuda");
  EXPECT_DEATH(
      {
        cross_entropy_backward(gpu, glogits, past_whole, to_device(gpu, random_tensor({rows}, 8)),
                               kScale, gdlogits, shard);
        gpu.synchronize();
      },
      "CHECK\\(cuda");
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
