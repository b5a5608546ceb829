// Document-aware attention (kernels/attention.h, doc_starts): query i reads keys
// [start_i, i] of its window. Checked against a naive masked reference, finite
// differences, and attention run on each document alone.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "tests/finite_differences.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::any_nonzero;
using testing::central_differences;
using testing::max_relative_error;
using testing::random_vector;

// Two windows of 4 query heads on 2 KV heads, long enough for several causal blocks.
constexpr cpu::AttentionShape kShape{2, 2 * cpu::kAttentionBlock + 22, 4, 2, 6};
constexpr cpu::AttentionShape kShort{2, 11, 4, 2, 5};

int64_t q_numel(const cpu::AttentionShape& s) { return s.batch * s.seq * s.heads * s.head_dim; }
int64_t kv_numel(const cpu::AttentionShape& s) { return s.batch * s.seq * s.kv_heads * s.head_dim; }

// Each window's document starts from its document lengths (the last may run past the
// window): start_i is the first position of the document holding i.
std::vector<int32_t> starts_from_lengths(const cpu::AttentionShape& s,
                                         const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < s.batch; ++b) {
    int64_t begin = 0, doc = 0;
    for (int64_t i = 0; i < s.seq; ++i) {
      if (i == begin + lengths[b][doc]) begin += lengths[b][doc++];
      starts.push_back(static_cast<int32_t>(begin));
    }
  }
  return starts;
}

// Window 0: documents that end inside blocks, across a block boundary and one of a
// single token; window 1: one document, as plain causal attention sees it.
std::vector<int32_t> long_starts() {
  return starts_from_lengths(kShape, {{5, 1, 70, 30, 1000}, {1000}});
}
std::vector<int32_t> short_starts() { return starts_from_lengths(kShort, {{3, 1, 4, 10}, {6, 10}}); }

struct Inputs {
  std::vector<double> q, k, v;
};

Inputs random_inputs(const cpu::AttentionShape& s, uint64_t seed) {
  return {random_vector<double>(q_numel(s), seed, -2, 2),
          random_vector<double>(kv_numel(s), seed + 1, -2, 2),
          random_vector<double>(kv_numel(s), seed + 2)};
}

// softmax over keys [start_i, i] of q_i k_j / sqrt(d), times v, per (window, head, row);
// and each row's log-sum-exp.
std::vector<double> naive_masked(const cpu::AttentionShape& s, const Inputs& in,
                                 const std::vector<int32_t>& starts,
                                 std::vector<double>* lse = nullptr) {
  const int64_t D = s.head_dim, group = s.heads / s.kv_heads;
  std::vector<double> out(q_numel(s), 0.0);
  if (lse) lse->assign(s.batch * s.heads * s.seq, 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        const int64_t first = starts[b * s.seq + i];
        const double* qi = &in.q[((b * s.seq + i) * s.heads + h) * D];
        std::vector<double> w(i + 1, 0.0);
        double max = -INFINITY, sum = 0;
        for (int64_t j = first; j <= i; ++j) {
          const double* kj = &in.k[((b * s.seq + j) * s.kv_heads + h / group) * D];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          w[j] = dot / std::sqrt(static_cast<double>(D));
          max = std::max(max, w[j]);
        }
        for (int64_t j = first; j <= i; ++j) sum += (w[j] = std::exp(w[j] - max));
        if (lse) (*lse)[(b * s.heads + h) * s.seq + i] = max + std::log(sum);
        double* oi = &out[((b * s.seq + i) * s.heads + h) * D];
        for (int64_t j = first; j <= i; ++j) {
          const double* vj = &in.v[((b * s.seq + j) * s.kv_heads + h / group) * D];
          for (int64_t d = 0; d < D; ++d) oi[d] += w[j] / sum * vj[d];
        }
      }
    }
  }
  return out;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// The CPU kernels in double: forward, then the backward of sum(gy * out).
Result run(const cpu::AttentionShape& s, const Inputs& in, const std::vector<double>& gy,
           const int32_t* starts) {
  Result r{std::vector<double>(q_numel(s), NAN), std::vector<double>(s.batch * s.heads * s.seq, NAN),
           std::vector<double>(q_numel(s), NAN), std::vector<double>(kv_numel(s), NAN),
           std::vector<double>(kv_numel(s), NAN)};
  cpu::attention_forward<double>(in.q.data(), in.k.data(), in.v.data(), s, r.out.data(),
                                 r.lse.data(), starts);
  cpu::attention_backward<double>(gy.data(), in.q.data(), in.k.data(), in.v.data(), r.out.data(),
                                  r.lse.data(), s, r.dq.data(), r.dk.data(), r.dv.data(), starts);
  return r;
}

TEST(DocumentAttentionTest, ForwardMatchesNaiveMaskedReference) {
  for (const auto& [s, starts] : {std::pair{kShape, long_starts()}, std::pair{kShort, short_starts()}}) {
    const Inputs in = random_inputs(s, 1);
    std::vector<double> expected_lse;
    const auto expected = naive_masked(s, in, starts, &expected_lse);
    const Result r = run(s, in, random_vector<double>(q_numel(s), 4), starts.data());
    EXPECT_LT(max_relative_error(r.out, expected), 1e-13) << "seq " << s.seq;
    EXPECT_LT(max_relative_error(r.lse, expected_lse), 1e-13) << "seq " << s.seq;
  }
}

// With every start 0 the kernels do what they do without documents, bit for bit.
TEST(DocumentAttentionTest, OneDocumentPerWindowIsPlainCausalAttention) {
  const auto& s = kShape;
  const Inputs in = random_inputs(s, 5);
  const auto gy = random_vector<double>(q_numel(s), 8);
  const std::vector<int32_t> zeros(s.batch * s.seq, 0);
  const Result plain = run(s, in, gy, nullptr), docs = run(s, in, gy, zeros.data());
  EXPECT_EQ(plain.out, docs.out);
  EXPECT_EQ(plain.lse, docs.lse);
  EXPECT_EQ(plain.dq, docs.dq);
  EXPECT_EQ(plain.dk, docs.dk);
  EXPECT_EQ(plain.dv, docs.dv);
}

// Each document of a packed window gets what attention over it alone gives: outputs and
// every gradient.
TEST(DocumentAttentionTest, PackedDocumentsEqualEachDocumentAlone) {
  const auto& s = kShape;
  const std::vector<int32_t> starts = long_starts();
  const Inputs in = random_inputs(s, 11);
  const auto gy = random_vector<double>(q_numel(s), 14);
  const Result packed = run(s, in, gy, starts.data());
  const int64_t row_q = s.heads * s.head_dim, row_kv = s.kv_heads * s.head_dim;
  for (int64_t begin = 0; begin < s.seq;) {
    int64_t end = begin + 1;
    while (end < s.seq && starts[end] == begin) ++end;  // window 0
    const cpu::AttentionShape one{1, end - begin, s.heads, s.kv_heads, s.head_dim};
    auto part = [&](const std::vector<double>& x, int64_t row) {
      return std::vector<double>(x.begin() + begin * row, x.begin() + end * row);
    };
    const Inputs alone_in{part(in.q, row_q), part(in.k, row_kv), part(in.v, row_kv)};
    const Result alone = run(one, alone_in, part(gy, row_q), nullptr);
    SCOPED_TRACE(::testing::Message() << "document [" << begin << ", " << end << ")");
    EXPECT_LT(max_relative_error(part(packed.out, row_q), alone.out), 1e-13);
    EXPECT_LT(max_relative_error(part(packed.dq, row_q), alone.dq), 1e-12);
    EXPECT_LT(max_relative_error(part(packed.dk, row_kv), alone.dk), 1e-12);
    EXPECT_LT(max_relative_error(part(packed.dv, row_kv), alone.dv), 1e-12);
    begin = end;
  }
}

// Gradients of sum(gy * out) against central differences of the naive masked reference.
void check_backward(const cpu::AttentionShape& s, const std::vector<int32_t>& starts,
                    int64_t stride, uint64_t seed) {
  Inputs in = random_inputs(s, seed);
  const auto gy = random_vector<double>(q_numel(s), seed + 3);
  const Result r = run(s, in, gy, starts.data());
  auto loss = [&] {
    const auto y = naive_masked(s, in, starts);
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
    EXPECT_TRUE(any_nonzero(grad)) << name;
  };
  check(in.q, r.dq, "dq");
  check(in.k, r.dk, "dk");
  check(in.v, r.dv, "dv");
}

TEST(DocumentAttentionTest, BackwardMatchesFiniteDifferencesAcrossBlocks) {
  check_backward(kShape, long_starts(), 37, 30);
}

Tensor starts_tensor(const cpu::AttentionShape& s, const std::vector<int32_t>& starts) {
  Tensor t = Tensor::empty({s.batch, s.seq}, DType::kI32);
  std::copy(starts.begin(), starts.end(), t.data<int32_t>());
  return t;
}

TEST(DocumentAttentionDeathTest, BadDocStartsAreRefused) {
  const auto& s = kShort;
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Tensor q = Tensor::zeros(q_shape), k = Tensor::zeros(kv_shape);
  Tensor out = Tensor::zeros(q_shape), lse = Tensor::zeros({s.batch, s.heads, s.seq});
  EXPECT_DEATH(attention_forward(cpu_device(), q, k, k, out, lse, Tensor::zeros({s.batch, s.seq})),
               "doc_starts must be \\(batch, seq\\) i32");
  std::vector<int32_t> ahead = short_starts();
  ahead[2] = 3;  // after its own position
  EXPECT_DEATH(attention_forward(cpu_device(), q, k, k, out, lse, starts_tensor(s, ahead)),
               "0 <= start_i <= i, non-decreasing");
  std::vector<int32_t> back = short_starts();
  back[5] = 0;  // before the previous position's start
  EXPECT_DEATH(attention_forward(cpu_device(), q, k, k, out, lse, starts_tensor(s, back)),
               "0 <= start_i <= i, non-decreasing");
}

}  // namespace
}  // namespace switchyard
