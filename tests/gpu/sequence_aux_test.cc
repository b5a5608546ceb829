// CUDA sums and gradient of the sequence-wise auxiliary loss against their CPU twins, with
// a rank's rows starting inside a sequence.
#include "kernels/sequence_aux.h"

#include <gtest/gtest.h>

#include "engine/runtime/rng.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::host_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

// Expert ids in [-1, E): -1 marks an unsent assignment, which counts for no expert.
Tensor expert_ids(int64_t n, int64_t k, int64_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(experts + 1)) - 1;
  return host_tensor({n, k}, ids);
}

TEST(SequenceAuxGpu, SumsAndGradientMatchCpu) {
  CudaDevice gpu(0);
  const int64_t experts = 13, k = 3, seq_len = 700, sequences = 6;
  // All rows, none, and a rank's share that starts and ends inside sequences.
  for (const auto& [first, n] :
       {std::pair<int64_t, int64_t>{0, sequences * seq_len}, {0, 0}, {1234, 1500}}) {
    SCOPED_TRACE(first);
    for (bool normalize : {false, true}) {
      const Tensor probs = random_tensor({n, experts}, 1, 0.01, 1.0);
      const Tensor ids = expert_ids(n, k, experts, 2);
      const Tensor gprobs = to_device(gpu, probs);
      const SequenceRows rows{first, seq_len};
      Tensor sums = Tensor::empty({sequences, 2 * experts});
      sequence_routing_sums(cpu_device(), probs, ids, normalize, rows, sums);
      Tensor gsums = poisoned(gpu, {sequences, 2 * experts});
      sequence_routing_sums(gpu, gprobs, to_device(gpu, ids), normalize, rows, gsums);
      EXPECT_TRUE(all_close(gsums, sums, 1e-6));

      Tensor dlogits = random_tensor({n, experts}, 4);  // accumulated into
      Tensor gdlogits = to_device(gpu, dlogits);
      sequence_aux_backward(gpu, gprobs, to_device(gpu, sums), normalize, rows, 1e-3f, gdlogits);
      sequence_aux_backward(cpu_device(), probs, sums, normalize, rows, 1e-3f, dlogits);
      EXPECT_TRUE(all_close(gdlogits, dlogits, 1e-5));
    }
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
