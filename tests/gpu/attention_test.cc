// CUDA flash attention (causal, grouped KV heads) against its CPU twin, with f32 and with
// bf16 activations (f32 lse either way), without and with document starts.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::any_nonzero;
using testing::as_bf16;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

// f32: both backends compute in f32 and differ only in summation order.
constexpr double kF32Tol = 1e-4;
// bf16: the GPU rounds the probabilities (in [0, 1]) and the score gradients to bf16 as
// tensor-core operands, a relative error of at most 2^-9 per term of the sums over keys
// or queries, which the CPU does not; outputs with |x| < 1 are compared absolutely and
// stay within a few 2^-9 of the CPU; a final rounding that lands on the other side of a
// bf16 tie adds one ulp, 2^-7 relative at most. 1/64 leaves room for both.
constexpr double kBf16Tol = 1.0 / 64;

struct Case {
  int64_t batch, seq, heads, kv_heads, head_dim;
  // Document-aware attention: each window packs documents of these lengths (cycling,
  // window b starting at the b-th); empty: plain causal attention.
  std::vector<int64_t> documents = {};
};

// The case's doc_starts on the host, or undefined without documents.
Tensor doc_starts_of(const Case& c) {
  if (c.documents.empty()) return Tensor();
  Tensor t = Tensor::empty({c.batch, c.seq}, DType::kI32);
  const size_t n = c.documents.size();
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t begin = 0;
    size_t doc = static_cast<size_t>(b);
    for (int64_t i = 0; i < c.seq; ++i) {
      if (i == begin + c.documents[doc % n]) begin += c.documents[doc++ % n];
      t.data<int32_t>()[b * c.seq + i] = static_cast<int32_t>(begin);
    }
  }
  return t;
}

struct Shapes {
  Shape q, kv, lse;
};

Shapes shapes_of(const Case& c) {
  return {{c.batch, c.seq, c.heads, c.head_dim},
          {c.batch, c.seq, c.kv_heads, c.head_dim},
          {c.batch, c.heads, c.seq}};
}

class AttentionGpu : public ::testing::TestWithParam<Case> {};

// Runs forward and backward on the CPU and the GPU from the same `dtype` inputs and compares
// out and the gradients within `tol`, lse within kF32Tol. Both backwards read the CPU's out
// and lse, so they differ only by their own arithmetic; GPU outputs start poisoned (NaN),
// so an element left unwritten fails.
void check_against_cpu(const Case& c, DType dtype, double tol) {
  CudaDevice gpu(0);
  const Shapes sh = shapes_of(c);
  const Tensor q = testing::to_dtype(random_tensor(sh.q, 1, -2.0, 2.0), dtype);
  const Tensor k = testing::to_dtype(random_tensor(sh.kv, 2, -2.0, 2.0), dtype);
  const Tensor v = testing::to_dtype(random_tensor(sh.kv, 3), dtype);
  const Tensor dout = testing::to_dtype(random_tensor(sh.q, 4), dtype);
  const Tensor gq = to_device(gpu, q), gk = to_device(gpu, k), gv = to_device(gpu, v);
  const Tensor starts = doc_starts_of(c);
  const Tensor gstarts = starts.defined() ? to_device(gpu, starts) : Tensor();

  Tensor out = Tensor::empty(sh.q, dtype), lse = Tensor::empty(sh.lse);
  attention_forward(cpu_device(), q, k, v, out, lse, starts);
  Tensor gout = poisoned(gpu, sh.q, dtype), glse = poisoned(gpu, sh.lse);
  attention_forward(gpu, gq, gk, gv, gout, glse, gstarts);
  EXPECT_TRUE(all_close(gout, out, tol));
  EXPECT_TRUE(all_close(glse, lse, kF32Tol));

  Tensor dq = Tensor::empty(sh.q, dtype), dk = Tensor::empty(sh.kv, dtype),
         dv = Tensor::empty(sh.kv, dtype);
  attention_backward(cpu_device(), dout, q, k, v, out, lse, dq, dk, dv, starts);
  const Tensor gdout = to_device(gpu, dout), gout_cpu = to_device(gpu, out);
  const Tensor glse_cpu = to_device(gpu, lse);
  Tensor gdq = poisoned(gpu, sh.q, dtype), gdk = poisoned(gpu, sh.kv, dtype),
         gdv = poisoned(gpu, sh.kv, dtype);
  attention_backward(gpu, gdout, gq, gk, gv, gout_cpu, glse_cpu, gdq, gdk, gdv, gstarts);
  EXPECT_TRUE(all_close(gdq, dq, tol));
  EXPECT_TRUE(all_close(gdk, dk, tol));
  EXPECT_TRUE(all_close(gdv, dv, tol));

  // No atomics: a second backward gives the same bits.
  Tensor gdq2 = poisoned(gpu, sh.q, dtype), gdk2 = poisoned(gpu, sh.kv, dtype),
         gdv2 = poisoned(gpu, sh.kv, dtype);
  attention_backward(gpu, gdout, gq, gk, gv, gout_cpu, glse_cpu, gdq2, gdk2, gdv2, gstarts);
  EXPECT_TRUE(all_equal(gdq2, gdq));
  EXPECT_TRUE(all_equal(gdk2, gdk));
  EXPECT_TRUE(all_equal(gdv2, gdv));

  if (c.batch > 0) {
    EXPECT_TRUE(any_nonzero(out));
    EXPECT_TRUE(any_nonzero(dv));
  }
  if (c.batch > 0 && c.seq > 1) {
    EXPECT_TRUE(any_nonzero(dq));
    EXPECT_TRUE(any_nonzero(dk));
  }
}

TEST_P(AttentionGpu, F32MatchesCpu) { check_against_cpu(GetParam(), DType::kF32, kF32Tol); }

TEST_P(AttentionGpu, Bf16MatchesCpu) { check_against_cpu(GetParam(), DType::kBF16, kBf16Tol); }

// head_dim 64 and 128 (the two tile widths); seq 1, 17 (inside one tile) and 300 (several
// tiles, a partial last one); 2 query heads per KV head and all 4 on one; head_dim 40 and 8
// (zero-padded columns, a tensor-core step past the last one); no batch.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGpu,
                         ::testing::Values(Case{2, 1, 4, 2, 64}, Case{2, 17, 4, 2, 64},
                                           Case{2, 300, 4, 2, 64}, Case{2, 300, 4, 1, 64},
                                           Case{2, 1, 4, 1, 128}, Case{2, 17, 4, 1, 128},
                                           Case{2, 300, 4, 2, 128}, Case{2, 300, 4, 1, 128},
                                           Case{1, 70, 6, 2, 40}, Case{3, 33, 2, 1, 8},
                                           Case{0, 5, 2, 1, 8}));

// Documents that end inside a tile, one of a single position, ones spanning several tiles
// (bf16 tiles are 64 rows, f32 tiles 32), so whole key tiles are skipped and rows of one
// tile start in different documents.
INSTANTIATE_TEST_SUITE_P(Documents, AttentionGpu,
                         ::testing::Values(Case{2, 300, 4, 2, 64, {5, 1, 70, 3, 150}},
                                           Case{2, 300, 4, 1, 128, {64, 1, 100, 31}},
                                           Case{3, 33, 2, 1, 8, {1, 2, 3}}));

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
