#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/embedding.h"
#include "tests/bf16_test_util.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::stores;
using testing::to_dtype;

using testing::any_nonzero;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_integers;
using testing::random_vector;
using testing::values_of;

constexpr int64_t kVocab = 11, kHidden = 300, kTokens = 23;

TEST(EmbeddingTest, ForwardGathersRows) {
  // More tokens than vocabulary entries, so ids repeat.
  const auto ids = random_integers<int32_t>(kTokens, 1, 0, kVocab - 1);
  const auto table = random_vector<double>(kVocab * kHidden, 2);
  std::vector<double> out(kTokens * kHidden), expected(kTokens * kHidden);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t i = 0; i < kHidden; ++i) expected[t * kHidden + i] = table[ids[t] * kHidden + i];
  }
  cpu::embedding_forward<double>(ids.data(), table.data(), kTokens, kHidden, out.data());
  EXPECT_EQ(out, expected);
  EXPECT_TRUE(any_nonzero(out));
}

// A bf16 table gives bf16 rows (copied exactly, zeros for id -1); a bf16 gradient is
// added in f32 onto the f32 table gradient.
TEST(EmbeddingTest, Bf16OperandsComputeInF32) {
  std::vector<int32_t> id_values = random_integers<int32_t>(kTokens, 10, 0, kVocab - 1);
  id_values[4] = -1;
  const Tensor ids = host_tensor<int32_t>(id_values);
  const Tensor table = to_dtype(
      host_tensor<float>({kVocab, kHidden}, random_vector<float>(kVocab * kHidden, 11)), DType::kBF16);
  Tensor out = Tensor::empty({kTokens, kHidden}, DType::kBF16);
  Tensor out32 = Tensor::empty({kTokens, kHidden});
  embedding_forward(cpu_device(), ids, to_dtype(table, DType::kF32), out32);
  embedding_forward(cpu_device(), ids, table, out);
  EXPECT_TRUE(stores(out, out32));
  EXPECT_TRUE(any_nonzero(values_of<float>(out32)));

  const Tensor dout = to_dtype(
      host_tensor<float>({kTokens, kHidden}, random_vector<float>(kTokens * kHidden, 12)), DType::kBF16);
  const Tensor dtable0 = host_tensor<float>({kVocab, kHidden}, random_vector<float>(kVocab * kHidden, 13));
  Tensor dtable = to_dtype(dtable0, DType::kF32), dtable32 = to_dtype(dtable0, DType::kF32);
  embedding_backward(cpu_device(), ids, to_dtype(dout, DType::kF32), dtable32);
  embedding_backward(cpu_device(), ids, dout, dtable);
  EXPECT_TRUE(stores(dtable, dtable32));
}

TEST(EmbeddingDeathTest, RejectsMixedTableAndOutputTypes) {
  const Tensor ids = host_tensor<int32_t>(std::vector<int32_t>{0, 1});
  const Tensor table = Tensor::zeros({kVocab, kHidden}, DType::kBF16);
  Tensor out = Tensor::empty({2, kHidden});
  EXPECT_DEATH(embedding_forward(cpu_device(), ids, table, out), "both f32 or both bf16");
}

}  // namespace
}  // namespace switchyard
