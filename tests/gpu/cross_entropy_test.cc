// The CUDA cross-entropy kernels trap on a target past the vocabulary (the CPU checks the
// targets on the host; the comparisons with the CPU are the op table's cross_entropy
// entry, tests/ops/op_table.h). The traps are meant: scripts/gpu_check.sh keeps death
// tests out of compute-sanitizer's runs.
#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::host_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

constexpr float kScale = 0.37f;

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
