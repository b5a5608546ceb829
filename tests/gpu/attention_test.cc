// CUDA causal grouped-KV attention against its CPU twin, with f32 and with bf16
// activations (f32 probs either way).
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include "kernels/convert.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::as_bf16;

using testing::all_close;
using testing::any_nonzero;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;

constexpr double kTol = 1e-5;

struct Case {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

class AttentionGpu : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGpu, ForwardAndBackwardMatchCpu) {
  const Case c = GetParam();
  CudaDevice gpu(0);
  const Shape q_shape{c.batch, c.seq, c.heads, c.head_dim};
  const Shape kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
  const Shape probs_shape{c.batch, c.heads, c.seq, c.seq};
  const Tensor q = random_tensor(q_shape, 1, -2.0, 2.0);
  const Tensor k = random_tensor(kv_shape, 2, -2.0, 2.0);
  const Tensor v = random_tensor(kv_shape, 3);
  const Tensor gq = to_device(gpu, q), gk = to_device(gpu, k), gv = to_device(gpu, v);

  Tensor out = Tensor::empty(q_shape), probs = Tensor::empty(probs_shape);
  attention_forward(cpu_device(), q, k, v, out, probs);
  // Poisoned probs also check that the entries above the diagonal are written (zeros).
  Tensor gout = poisoned(gpu, q_shape), gprobs = poisoned(gpu, probs_shape);
  attention_forward(gpu, gq, gk, gv, gout, gprobs);
  EXPECT_TRUE(all_close(gout, out, kTol));
  EXPECT_TRUE(all_close(gprobs, probs, kTol));

  // Both backwards read the CPU probs, so they differ only by their own arithmetic.
  const Tensor dout = random_tensor(q_shape, 4);
  Tensor dq = Tensor::empty(q_shape), dk = Tensor::empty(kv_shape), dv = Tensor::empty(kv_shape);
  attention_backward(cpu_device(), dout, q, k, v, probs, dq, dk, dv);
  Tensor gdq = poisoned(gpu, q_shape), gdk = poisoned(gpu, kv_shape), gdv = poisoned(gpu, kv_shape);
  attention_backward(gpu, to_device(gpu, dout), gq, gk, gv, to_device(gpu, probs), gdq, gdk, gdv);
  EXPECT_TRUE(all_close(gdq, dq, kTol));
  EXPECT_TRUE(all_close(gdk, dk, kTol));
  EXPECT_TRUE(all_close(gdv, dv, kTol));
  if (c.batch > 0 && c.seq > 1) {
    EXPECT_TRUE(any_nonzero(dq));
    EXPECT_TRUE(any_nonzero(dk));
  }
}

// bf16 q, k, v, dout on both backends, which compute in f32 from the same widened values:
// the f32 probs agree to f32 rounding, the bf16 outputs and gradients to one bf16 rounding.
TEST_P(AttentionGpu, Bf16MatchesCpu) {
  const Case c = GetParam();
  CudaDevice gpu(0);
  const double bf16_tol = 1.0 / 128, f32_tol = 1e-4;
  const Shape q_shape{c.batch, c.seq, c.heads, c.head_dim};
  const Shape kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
  const Shape probs_shape{c.batch, c.heads, c.seq, c.seq};
  const Tensor q = as_bf16(random_tensor(q_shape, 1, -2.0, 2.0));
  const Tensor k = as_bf16(random_tensor(kv_shape, 2, -2.0, 2.0));
  const Tensor v = as_bf16(random_tensor(kv_shape, 3));
  const Tensor gq = to_device(gpu, q), gk = to_device(gpu, k), gv = to_device(gpu, v);

  Tensor out = Tensor::empty(q_shape, DType::kBF16), probs = Tensor::empty(probs_shape);
  attention_forward(cpu_device(), q, k, v, out, probs);
  Tensor gout = poisoned(gpu, q_shape, DType::kBF16), gprobs = poisoned(gpu, probs_shape);
  attention_forward(gpu, gq, gk, gv, gout, gprobs);
  EXPECT_TRUE(all_close(gout, out, bf16_tol));
  EXPECT_TRUE(all_close(gprobs, probs, f32_tol));

  const Tensor dout = as_bf16(random_tensor(q_shape, 4));
  Tensor dq = Tensor::empty(q_shape, DType::kBF16), dk = Tensor::empty(kv_shape, DType::kBF16),
         dv = Tensor::empty(kv_shape, DType::kBF16);
  attention_backward(cpu_device(), dout, q, k, v, probs, dq, dk, dv);
  Tensor gdq = poisoned(gpu, q_shape, DType::kBF16), gdk = poisoned(gpu, kv_shape, DType::kBF16),
         gdv = poisoned(gpu, kv_shape, DType::kBF16);
  attention_backward(gpu, to_device(gpu, dout), gq, gk, gv, to_device(gpu, probs), gdq, gdk, gdv);
  EXPECT_TRUE(all_close(gdq, dq, bf16_tol));
  EXPECT_TRUE(all_close(gdk, dk, bf16_tol));
  EXPECT_TRUE(all_close(gdv, dv, bf16_tol));
  if (c.batch > 0 && c.seq > 1) {
    EXPECT_TRUE(any_nonzero(out));
    EXPECT_TRUE(any_nonzero(dq));
    EXPECT_TRUE(any_nonzero(dk));
  }
}

// Grouped queries (3 per KV head); more rows and columns than a block has threads (several
// tiles, several columns per thread), one head per KV head; a single position; all query
// heads on one KV head.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGpu,
                         ::testing::Values(Case{2, 37, 6, 2, 40}, Case{1, 300, 4, 4, 150},
                                           Case{3, 1, 2, 1, 8}, Case{2, 200, 8, 1, 64},
                                           Case{0, 5, 2, 1, 8}));

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
