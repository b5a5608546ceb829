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

TEST(EmbeddingTest, BackwardMatchesFiniteDifferences) {
  const auto ids = random_integers<int32_t>(kTokens, 3, 0, kVocab - 1);
  auto table = random_vector<double>(kVocab * kHidden, 4);
  const auto gy = random_vector<double>(kTokens * kHidden, 5);
  auto loss = [&] {
    std::vector<double> out(kTokens * kHidden);
    cpu::embedding_forward<double>(ids.data(), table.data(), kTokens, kHidden, out.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += gy[i] * out[i];
    return l;
  };
  // dtable accumulates onto what is there.
  const auto dtable0 = random_vector<double>(kVocab * kHidden, 6);
  auto dtable = dtable0;
  cpu::embedding_backward<double>(ids.data(), gy.data(), kTokens, kHidden, dtable.data());
  const double eps = 1e-6;
  std::vector<double> expected(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const double saved = table[i];
    table[i] = saved + eps;
    const double up = loss();
    table[i] = saved - eps;
    const double down = loss();
    table[i] = saved;
    expected[i] = dtable0[i] + (up - down) / (2 * eps);
  }
  EXPECT_LT(max_relative_error(dtable, expected), 1e-6);
}

TEST(EmbeddingTest, FloatOpsMatchDoubleTemplates) {
  const auto ids = random_integers<int32_t>(kTokens, 7, 0, kVocab - 1);
  const auto table = random_vector<float>(kVocab * kHidden, 8);
  const auto gy = random_vector<float>(kTokens * kHidden, 9);
  Tensor tids = to_tensor(ids), ttable = to_tensor(table, {kVocab, kHidden});
  Tensor tgy = to_tensor(gy, {kTokens, kHidden}), tout = Tensor::empty({kTokens, kHidden});
  Tensor tdtable = Tensor::zeros({kVocab, kHidden});
  embedding_forward(cpu_device(), tids, ttable, tout);
  embedding_backward(cpu_device(), tids, tgy, tdtable);

  const std::vector<double> table_d(table.begin(), table.end()), gy_d(gy.begin(), gy.end());
  std::vector<double> out(kTokens * kHidden), dtable(kVocab * kHidden, 0.0);
  cpu::embedding_forward<double>(ids.data(), table_d.data(), kTokens, kHidden, out.data());
  cpu::embedding_backward<double>(ids.data(), gy_d.data(), kTokens, kHidden, dtable.data());
  EXPECT_LT(max_relative_error(to_vector(tout), out), 1e-5);
  EXPECT_LT(max_relative_error(to_vector(tdtable), dtable), 1e-5);
  EXPECT_TRUE(any_nonzero(to_vector(tout)));
  EXPECT_TRUE(any_nonzero(to_vector(tdtable)));
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
