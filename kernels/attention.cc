#include "kernels/attention.h"

#include "kernels/cpu/attention.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {
namespace {

// Checks q (B, S, H, D) and k, v (B, S, KV, D) and returns their shape.
cpu::AttentionShape check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  SY_CHECK_MSG(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
               "attention: q, k, v must be (batch, seq, heads, head_dim)");
  SY_CHECK_MSG(q.dtype() == DType::kF32 && k.dtype() == DType::kF32 && v.dtype() == DType::kF32,
               "attention: q, k, v must be f32");
  const cpu::AttentionShape s{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  SY_CHECK_MSG(
      k.shape() == v.shape() && k.dim(0) == s.batch && k.dim(1) == s.seq && k.dim(3) == s.head_dim,
      "attention: k and v do not match q");
  SY_CHECK_MSG(s.kv_heads > 0 && s.heads % s.kv_heads == 0,
               "attention: heads must be a multiple of kv_heads");
  return s;
}

Shape probs_shape(const cpu::AttentionShape& s) { return {s.batch, s.heads, s.seq, s.seq}; }

#ifdef SWITCHYARD_WITH_CUDA
cuda::AttentionShape cuda_shape(const cpu::AttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim};
}
#endif

}  // namespace

void attention_forward(Device& dev, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs) {
  const cpu::AttentionShape s = check_qkv(q, k, v);
  SY_CHECK_MSG(out.shape() == q.shape() && probs.shape() == probs_shape(s),
               "attention_forward: out must be like q and probs (batch, heads, seq, seq)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::attention_forward<float>(q.data<float>(), k.data<float>(), v.data<float>(), cuda_shape(s),
                                   out.data<float>(), probs.data<float>(),
                                   op_stream(dev, "attention_forward", {&q, &k, &v, &out, &probs}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "attention_forward: this build has no CUDA backend");
  cpu::attention_forward<float>(q.data<float>(), k.data<float>(), v.data<float>(), s,
                                out.data<float>(), probs.data<float>());
}

void attention_backward(Device& dev, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& probs, Tensor& dq, Tensor& dk, Tensor& dv) {
  const cpu::AttentionShape s = check_qkv(q, k, v);
  SY_CHECK_MSG(dout.shape() == q.shape() && dq.shape() == q.shape() && dk.shape() == k.shape() &&
                   dv.shape() == v.shape() && probs.shape() == probs_shape(s),
               "attention_backward: gradient shapes do not match q, k, v");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::attention_backward<float>(
        dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), probs.data<float>(),
        cuda_shape(s), dq.data<float>(), dk.data<float>(), dv.data<float>(),
        op_stream(dev, "attention_backward", {&dout, &q, &k, &v, &probs, &dq, &dk, &dv}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "attention_backward: this build has no CUDA backend");
  cpu::attention_backward<float>(dout.data<float>(), q.data<float>(), k.data<float>(),
                                 v.data<float>(), probs.data<float>(), s, dq.data<float>(),
                                 dk.data<float>(), dv.data<float>());
}

}  // namespace switchyard
