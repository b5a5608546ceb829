// CUDA embedding lookup and gradient against their CPU twins.
#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_equal;
using testing::host_tensor;
using testing::integer_tensor;
using testing::poisoned;
using testing::random_integers;
using testing::random_tensor;
using testing::to_device;

// Token ids with many repeats (most from a small range), so the gradient adds several
// rows into the same table rows; the last id of the vocabulary appears, and so does -1
// (a row held elsewhere: a zero row, no gradient).
Tensor token_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids = random_integers<int32_t>(n, seed, 0, 19);
  const std::vector<int32_t> any =
      random_integers<int32_t>(n, seed + 1, 0, static_cast<int>(vocab - 1));
  for (int64_t t = 0; t < n; t += 7) ids[t] = any[t];
  for (int64_t t = 3; t < n; t += 11) ids[t] = -1;
  if (n > 0) ids[n - 1] = static_cast<int32_t>(vocab - 1);
  return host_tensor({n}, ids);
}

TEST(EmbeddingGpu, ForwardAndBackwardMatchCpuExactly) {
  CudaDevice gpu(0);
  const int64_t vocab = 101, hidden = 300;
  for (int64_t n : {0, 1, 257, 5000}) {
    SCOPED_TRACE(n);
    const Tensor ids = token_ids(n, vocab, 1);
    const Tensor gids = to_device(gpu, ids);
    const Tensor table = random_tensor({vocab, hidden}, 2);
    Tensor out = Tensor::empty({n, hidden});
    embedding_forward(cpu_device(), ids, table, out);
    Tensor gout = poisoned(gpu, {n, hidden});
    embedding_forward(gpu, gids, to_device(gpu, table), gout);
    EXPECT_TRUE(all_equal(gout, out));

    // The GPU adds each id's rows in the CPU's pieces (32 sorted positions; at 5000 tokens
    // the frequent ids run over a dozen pieces), the additions the CPU makes, so even
    // random floats agree bit for bit; integers check it independently of that order.
    for (bool integers : {false, true}) {
      SCOPED_TRACE(integers ? "integer-valued" : "random floats");
      const Tensor dout =
          integers ? integer_tensor({n, hidden}, 3, -9, 9) : random_tensor({n, hidden}, 3);
      Tensor dtable =
          integers ? integer_tensor({vocab, hidden}, 4, -9, 9) : random_tensor({vocab, hidden}, 4);
      Tensor gdtable = to_device(gpu, dtable);
      embedding_backward(gpu, gids, to_device(gpu, dout), gdtable);
      embedding_backward(cpu_device(), ids, dout, dtable);
      EXPECT_TRUE(all_equal(gdtable, dtable));
    }
  }
}

// A bf16 table gives bf16 rows copied exactly; a bf16 gradient is added in f32 onto the
// f32 table gradient in token order on both sides, so the results agree bit for bit.
TEST(EmbeddingGpu, Bf16ForwardAndBackwardMatchCpuExactly) {
  CudaDevice gpu(0);
  const int64_t vocab = 101, hidden = 300;
  for (int64_t n : {0, 1, 257, 5000}) {
    SCOPED_TRACE(n);
    const Tensor ids = token_ids(n, vocab, 5);
    const Tensor gids = to_device(gpu, ids);
    const Tensor table = as_bf16(random_tensor({vocab, hidden}, 6));
    Tensor out = Tensor::empty({n, hidden}, DType::kBF16);
    embedding_forward(cpu_device(), ids, table, out);
    Tensor gout = poisoned(gpu, {n, hidden}, DType::kBF16);
    embedding_forward(gpu, gids, to_device(gpu, table), gout);
    EXPECT_TRUE(all_equal(gout, out));

    const Tensor dout = as_bf16(random_tensor({n, hidden}, 7));
    Tensor dtable = random_tensor({vocab, hidden}, 8);
    Tensor gdtable = to_device(gpu, dtable);
    embedding_backward(gpu, gids, to_device(gpu, dout), gdtable);
    embedding_backward(cpu_device(), ids, dout, dtable);
    EXPECT_TRUE(all_equal(gdtable, dtable));
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
