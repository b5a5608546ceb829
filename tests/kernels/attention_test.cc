#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/attention.h"
#include "tests/finite_differences.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::central_differences;
using testing::host_tensor;
using testing::max_relative_error;
using testing::random_vector;
using testing::values_of;

// Grouped-query shape: 4 query heads on 2 KV heads. The long sequence spans several
// causal blocks, with a partial last one; kShared puts all query heads on one KV head;
// kOne is a single position.
constexpr cpu::AttentionShape kShort{2, 9, 4, 2, 6};
constexpr cpu::AttentionShape kLong{2, 2 * cpu::kAttentionBlock + 22, 4, 2, 6};
constexpr cpu::AttentionShape kShared{1, 13, 4, 1, 5};
constexpr cpu::AttentionShape kOne{2, 1, 4, 2, 6};

int64_t q_numel(const cpu::AttentionShape& s) { return s.batch * s.seq * s.heads * s.head_dim; }
int64_t kv_numel(const cpu::AttentionShape& s) { return s.batch * s.seq * s.kv_heads * s.head_dim; }
int64_t lse_numel(const cpu::AttentionShape& s) { return s.batch * s.heads * s.seq; }

struct Inputs {
  std::vector<double> q, k, v;
};

Inputs random_inputs(const cpu::AttentionShape& s, uint64_t seed) {
  return {random_vector<double>(q_numel(s), seed, -2, 2),
          random_vector<double>(kv_numel(s), seed + 1, -2, 2),
          random_vector<double>(kv_numel(s), seed + 2)};
}

// Direct causal softmax(q k^T / sqrt(d)) v per (batch, head, query row), and each row's
// log(sum_j exp(score_j)).
std::vector<double> naive_attention(const cpu::AttentionShape& s, const Inputs& in,
                                    std::vector<double>* lse = nullptr) {
  const int64_t D = s.head_dim, group = s.heads / s.kv_heads;
  std::vector<double> out(q_numel(s), 0.0);
  if (lse) lse->assign(lse_numel(s), 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.seq; ++i) {
        const double* qi = &in.q[((b * s.seq + i) * s.heads + h) * D];
        std::vector<double> w(i + 1);
        double max = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const double* kj = &in.k[((b * s.seq + j) * s.kv_heads + g) * D];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          w[j] = dot / std::sqrt(static_cast<double>(D));
          max = std::max(max, w[j]);
        }
        double sum = 0;
        for (auto& x : w) sum += (x = std::exp(x - max));
        if (lse) (*lse)[(b * s.heads + h) * s.seq + i] = max + std::log(sum);
        double* oi = &out[((b * s.seq + i) * s.heads + h) * D];
        for (int64_t j = 0; j <= i; ++j) {
          w[j] /= sum;
          const double* vj = &in.v[((b * s.seq + j) * s.kv_heads + g) * D];
          for (int64_t d = 0; d < D; ++d) oi[d] += w[j] * vj[d];
        }
      }
    }
  }
  return out;
}

void run_forward(const cpu::AttentionShape& s, const Inputs& in, std::vector<double>& out,
                 std::vector<double>& lse) {
  out.assign(q_numel(s), NAN);  // Not a value, so unwritten entries show.
  lse.assign(lse_numel(s), NAN);
  cpu::attention_forward<double>(in.q.data(), in.k.data(), in.v.data(), s, out.data(), lse.data());
}

// Gradients of loss = sum(gy * out), as the double template computes them.
struct Grads {
  std::vector<double> dq, dk, dv;
};

Grads run_backward(const cpu::AttentionShape& s, const Inputs& in, const std::vector<double>& gy) {
  std::vector<double> out, lse;
  run_forward(s, in, out, lse);
  Grads g{std::vector<double>(q_numel(s), NAN), std::vector<double>(kv_numel(s), NAN),
          std::vector<double>(kv_numel(s), NAN)};
  cpu::attention_backward<double>(gy.data(), in.q.data(), in.k.data(), in.v.data(), out.data(),
                                  lse.data(), s, g.dq.data(), g.dk.data(), g.dv.data());
  return g;
}

TEST(AttentionTest, ForwardMatchesNaive) {
  for (const auto& s : {kShort, kLong, kShared, kOne}) {
    const Inputs in = random_inputs(s, 1);
    std::vector<double> expected_lse, out, lse;
    const auto expected = naive_attention(s, in, &expected_lse);
    run_forward(s, in, out, lse);
    EXPECT_LT(max_relative_error(out, expected), 1e-13) << "seq " << s.seq;
    EXPECT_LT(max_relative_error(lse, expected_lse), 1e-13) << "seq " << s.seq;
    EXPECT_TRUE(any_nonzero(out));
  }
}

// The first position attends to itself alone: its output is its value row and its lse its
// own scaled score.
TEST(AttentionTest, FirstPositionCopiesItsValue) {
  const auto& s = kShared;
  const Inputs in = random_inputs(s, 3);
  std::vector<double> out, lse;
  run_forward(s, in, out, lse);
  const int64_t D = s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const double* q0 = &in.q[(b * s.seq * s.heads + h) * D];
      const double* k0 = &in.k[b * s.seq * s.kv_heads * D];
      const double* v0 = &in.v[b * s.seq * s.kv_heads * D];
      double score = 0;
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_NEAR(out[(b * s.seq * s.heads + h) * D + d], v0[d], 1e-15);
        score += q0[d] * k0[d];
      }
      EXPECT_NEAR(lse[(b * s.heads + h) * s.seq], score / std::sqrt(double(D)), 1e-13);
    }
  }
}

TEST(AttentionTest, FutureKeysAndValuesDoNotChangeEarlierOutputs) {
  const auto& s = kLong;
  Inputs in = random_inputs(s, 2);
  std::vector<double> before, after, lse;
  run_forward(s, in, before, lse);
  const int64_t t = cpu::kAttentionBlock + 5;  // Inside the second block.
  for (int64_t d = 0; d < s.kv_heads * s.head_dim; ++d) {
    in.k[t * s.kv_heads * s.head_dim + d] += 1.0;
    in.v[t * s.kv_heads * s.head_dim + d] -= 1.0;
  }
  run_forward(s, in, after, lse);
  const int64_t row = s.heads * s.head_dim;
  for (int64_t i = 0; i < s.seq; ++i) {
    const std::vector<double> b(before.begin() + i * row, before.begin() + (i + 1) * row);
    const std::vector<double> a(after.begin() + i * row, after.begin() + (i + 1) * row);
    if (i < t)
      EXPECT_EQ(a, b) << "position " << i;
    else
      EXPECT_NE(a, b) << "position " << i;
  }
}

// Gradients of loss = sum(gy * out) against central differences, at the coordinates
// picked by `stride` (every one for short sequences, a spread sample for long ones).
void check_backward(const cpu::AttentionShape& s, int64_t stride, uint64_t seed) {
  Inputs in = random_inputs(s, seed);
  const auto gy = random_vector<double>(q_numel(s), seed + 3);
  const Grads grads = run_backward(s, in, gy);
  auto loss = [&] {
    const auto y = naive_attention(s, in);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += gy[i] * y[i];
    return l;
  };
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    const std::vector<double> numeric = central_differences(x, eps, loss, stride);
    std::vector<double> analytic;
    for (size_t i = 0; i < x.size(); i += stride) analytic.push_back(grad[i]);
    EXPECT_LT(max_relative_error(analytic, numeric), 1e-6) << name << " seq " << s.seq;
    if (s.seq > 1) {
      EXPECT_TRUE(any_nonzero(grad)) << name;
    }
  };
  check(in.q, grads.dq, "dq");
  check(in.k, grads.dk, "dk");
  check(in.v, grads.dv, "dv");
}

TEST(AttentionTest, BackwardMatchesFiniteDifferencesAcrossBlocks) { check_backward(kLong, 37, 20); }

// One position: softmax of a single score is 1, so dq and dk are zero and dv is dout
// summed over the group's heads.
TEST(AttentionTest, BackwardOfOnePosition) {
  const auto& s = kOne;
  const Inputs in = random_inputs(s, 27);
  const auto gy = random_vector<double>(q_numel(s), 28);
  const Grads grads = run_backward(s, in, gy);
  for (double x : grads.dq) EXPECT_NEAR(x, 0.0, 1e-15);
  for (double x : grads.dk) EXPECT_NEAR(x, 0.0, 1e-15);
  const int64_t D = s.head_dim, group = s.heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) sum += gy[(b * s.heads + h) * D + d];
        EXPECT_NEAR(grads.dv[(b * s.kv_heads + g) * D + d], sum, 1e-14);
      }
    }
  }
}

// `v` as a bf16 tensor of `shape` (each value rounded).
Tensor to_bf16_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor b = Tensor::empty(shape, DType::kBF16);
  convert(cpu_device(), host_tensor<float>(shape, v), b);
  return b;
}

// Every element of the bf16 `actual` is the f32 `expected` rounded once.
void expect_rounded(const Tensor& actual, const Tensor& expected, const char* name) {
  ASSERT_EQ(actual.numel(), expected.numel()) << name;
  int64_t differ = 0;
  for (int64_t i = 0; i < actual.numel(); ++i)
    differ += actual.data<bf16>()[i].bits != to_bf16(expected.data<float>()[i]).bits;
  EXPECT_EQ(differ, 0) << name;
}

// bf16 activations run as the f32 ops on their exact f32 values: the saved lse is that
// f32 lse, and out, dq, dk, dv are the f32 results rounded once (the backward reads the
// bf16 out, widened).
TEST(AttentionTest, Bf16OperandsComputeInF32) {
  for (const auto& s : {kShort, kLong, kShared, kOne}) {
    SCOPED_TRACE(::testing::Message() << "seq " << s.seq);
    const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
    const Shape kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
    const Shape lse_shape{s.batch, s.heads, s.seq};
    const Tensor q = to_bf16_tensor(random_vector<float>(q_numel(s), 40, -2, 2), q_shape);
    const Tensor k = to_bf16_tensor(random_vector<float>(kv_numel(s), 41, -2, 2), kv_shape);
    const Tensor v = to_bf16_tensor(random_vector<float>(kv_numel(s), 42), kv_shape);
    const Tensor dout = to_bf16_tensor(random_vector<float>(q_numel(s), 43), q_shape);

    Tensor out = Tensor::empty(q_shape, DType::kBF16), lse = Tensor::empty(lse_shape);
    attention_forward(cpu_device(), q, k, v, out, lse);
    Tensor out32 = Tensor::empty(q_shape), lse32 = Tensor::empty(lse_shape);
    attention_forward(cpu_device(), widened(q), widened(k), widened(v), out32, lse32);
    expect_rounded(out, out32, "out");
    EXPECT_EQ(values_of<float>(lse), values_of<float>(lse32));

    Tensor dq = Tensor::empty(q_shape, DType::kBF16), dk = Tensor::empty(kv_shape, DType::kBF16),
           dv = Tensor::empty(kv_shape, DType::kBF16);
    attention_backward(cpu_device(), dout, q, k, v, out, lse, dq, dk, dv);
    Tensor dq32 = Tensor::empty(q_shape), dk32 = Tensor::empty(kv_shape),
           dv32 = Tensor::empty(kv_shape);
    attention_backward(cpu_device(), widened(dout), widened(q), widened(k), widened(v),
                       widened(out), lse32, dq32, dk32, dv32);
    expect_rounded(dq, dq32, "dq");
    expect_rounded(dk, dk32, "dk");
    expect_rounded(dv, dv32, "dv");
    EXPECT_TRUE(any_nonzero(values_of<float>(out32)));
    EXPECT_TRUE(any_nonzero(values_of<float>(dv32)));
    if (s.seq > 1) {
      EXPECT_TRUE(any_nonzero(values_of<float>(dq32)));
      EXPECT_TRUE(any_nonzero(values_of<float>(dk32)));
    }
  }
}

// The same inputs give the same bits on every call.
TEST(AttentionTest, Deterministic) {
  const auto& s = kLong;
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Tensor q = host_tensor<float>(q_shape, random_vector<float>(q_numel(s), 50, -2, 2));
  const Tensor k = host_tensor<float>(kv_shape, random_vector<float>(kv_numel(s), 51, -2, 2));
  const Tensor v = host_tensor<float>(kv_shape, random_vector<float>(kv_numel(s), 52));
  const Tensor dout = host_tensor<float>(q_shape, random_vector<float>(q_numel(s), 53));
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    Tensor out = Tensor::empty(q_shape), lse = Tensor::empty({s.batch, s.heads, s.seq});
    Tensor dq = Tensor::empty(q_shape), dk = Tensor::empty(kv_shape), dv = Tensor::empty(kv_shape);
    attention_forward(cpu_device(), q, k, v, out, lse);
    attention_backward(cpu_device(), dout, q, k, v, out, lse, dq, dk, dv);
    run = {values_of<float>(out), values_of<float>(lse), values_of<float>(dq), values_of<float>(dk), values_of<float>(dv)};
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(AttentionDeathTest, BadDtypesAndShapesAreRefused) {
  const auto& s = kShort;
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Shape lse_shape{s.batch, s.heads, s.seq};
  const Tensor q16 = Tensor::zeros(q_shape, DType::kBF16);
  const Tensor k16 = Tensor::zeros(kv_shape, DType::kBF16), k32 = Tensor::zeros(kv_shape);
  Tensor out16 = Tensor::zeros(q_shape, DType::kBF16), out32 = Tensor::zeros(q_shape);
  Tensor lse = Tensor::zeros(lse_shape), lse16 = Tensor::zeros(lse_shape, DType::kBF16);
  Tensor lse_probs = Tensor::zeros({s.batch, s.heads, s.seq, s.seq});
  EXPECT_DEATH(attention_forward(cpu_device(), q16, k32, k16, out16, lse),
               "q, k, v, out must be all f32 or all bf16");
  EXPECT_DEATH(attention_forward(cpu_device(), q16, k16, k16, out32, lse),
               "q, k, v, out must be all f32 or all bf16");
  EXPECT_DEATH(attention_forward(cpu_device(), q16, k16, k16, out16, lse16), "lse must be f32");
  EXPECT_DEATH(attention_forward(cpu_device(), q16, k16, k16, out16, lse_probs),
               "lse must be \\(batch, heads, seq\\)");
  Tensor dk16 = Tensor::zeros(kv_shape, DType::kBF16), dv32 = Tensor::zeros(kv_shape);
  EXPECT_DEATH(
      attention_backward(cpu_device(), out16, q16, k16, k16, out16, lse, out16, dk16, dv32),
      "dout, q, k, v, out, dq, dk, dv must be all f32 or all bf16");
  EXPECT_DEATH(
      attention_backward(cpu_device(), out16, q16, k16, k16, out32, lse, out16, dk16, dk16),
      "dout, q, k, v, out, dq, dk, dv must be all f32 or all bf16");
  EXPECT_DEATH(
      attention_backward(cpu_device(), out16, q16, k16, k16, out16, lse16, out16, dk16, dk16),
      "lse must be f32");
  EXPECT_DEATH(
      attention_backward(cpu_device(), out16, q16, k16, k16, out16, lse_probs, out16, dk16, dk16),
      "lse must be \\(batch, heads, seq\\)");
}

}  // namespace
}  // namespace switchyard
