#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/embedding.h"
#include "tests/bf16_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::stores;
using testing::to_dtype;

using testing::any_nonzero;
using testing::max_relative_error;
using testing::random_integers;
using testing::random_vector;

constexpr int64_t kVocab = 11, kHidden = 300, kTokens = 23;

Tensor to_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor to_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

std::vector<float> to_vector(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

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
  const Tensor ids = to_tensor(id_values);
  const Tensor table = to_dtype(
      to_tensor(random_vector<float>(kVocab * kHidden, 11), {kVocab, kHidden}), DType::kBF16);
  Tensor out = Tensor::empty({kTokens, kHidden}, DType::kBF16);
  Tensor out32 = Tensor::empty({kTokens, kHidden});
  embedding_forward(cpu_device(), ids, to_dtype(table, DType::kF32), out32);
  embedding_forward(cpu_device(), ids, table, out);
  EXPECT_TRUE(stores(out, out32));
  EXPECT_TRUE(any_nonzero(to_vector(out32)));

  const Tensor dout = to_dtype(
      to_tensor(random_vector<float>(kTokens * kHidden, 12), {kTokens, kHidden}), DType::kBF16);
  const Tensor dtable0 = to_tensor(random_vector<float>(kVocab * kHidden, 13), {kVocab, kHidden});
  Tensor dtable = to_dtype(dtable0, DType::kF32), dtable32 = to_dtype(dtable0, DType::kF32);
  embedding_backward(cpu_device(), ids, to_dtype(dout, DType::kF32), dtable32);
  embedding_backward(cpu_device(), ids, dout, dtable);
  EXPECT_TRUE(stores(dtable, dtable32));
}

TEST(EmbeddingDeathTest, RejectsMixedTableAndOutputTypes) {
  const Tensor ids = to_tensor(std::vector<int32_t>{0, 1});
  const Tensor table = Tensor::zeros({kVocab, kHidden}, DType::kBF16);
  Tensor out = Tensor::empty({2, kHidden});
  EXPECT_DEATH(embedding_forward(cpu_device(), ids, table, out), "both f32 or both bf16");
}

}  // namespace
}  // namespace switchyard
