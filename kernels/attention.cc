#include "kernels/attention.h"

#include <initializer_list>

#include "core/runtime/op_clock.h"
#include "kernels/convert.h"
#include "kernels/cpu/attention.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#endif

namespace switchyard {
namespace {

// The activations and their gradients share one dtype, f32 or bf16.
void check_dtypes(std::initializer_list<const Tensor*> tensors, const char* message) {
  const DType dtype = (*tensors.begin())->dtype();
  bool ok = dtype == DType::kF32 || dtype == DType::kBF16;
  for (const Tensor* t : tensors) ok = ok && t->dtype() == dtype;
  SY_CHECK_MSG(ok, message);
}

// Checks q (B, S, H, D) and k, v (B, S, KV, D) and returns their shape.
cpu::AttentionShape check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  SY_CHECK_MSG(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
               "attention: q, k, v must be (batch, seq, heads, head_dim)");
  const cpu::AttentionShape s{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  SY_CHECK_MSG(
      k.shape() == v.shape() && k.dim(0) == s.batch && k.dim(1) == s.seq && k.dim(3) == s.head_dim,
      "attention: k and v do not match q");
  SY_CHECK_MSG(s.kv_heads > 0 && s.heads % s.kv_heads == 0,
               "attention: heads must be a multiple of kv_heads");
  return s;
}

Shape lse_shape(const cpu::AttentionShape& s) { return {s.batch, s.heads, s.seq}; }

// Checks doc_starts (see the header) and returns its data, or null when undefined. The
// values are checked on the host; on a device only the shape.
const int32_t* checked_doc_starts(const Tensor& doc_starts, const cpu::AttentionShape& s) {
  if (!doc_starts.defined()) return nullptr;
  const Shape shape{s.batch, s.seq};
  SY_CHECK_MSG(doc_starts.dtype() == DType::kI32 && doc_starts.shape() == shape,
               "attention: doc_starts must be (batch, seq) i32");
  const int32_t* starts = doc_starts.data<int32_t>();
  if (doc_starts.device().is_cuda()) return starts;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* row = starts + b * s.seq;
    for (int64_t i = 0; i < s.seq; ++i)
      SY_CHECK_MSG(row[i] >= 0 && row[i] <= i && (i == 0 || row[i] >= row[i - 1]),
                   "attention: doc_starts must satisfy 0 <= start_i <= i, non-decreasing");
  }
  return starts;
}

#ifdef SWITCHYARD_WITH_CUDA
cuda::AttentionShape cuda_shape(const cpu::AttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim};
}
#endif

}  // namespace

void attention_forward(Device& dev, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse, const Tensor& doc_starts) {
  const OpScope scope(OpKind::kAttentionCore, OpPass::kForward, dev);
  check_dtypes({&q, &k, &v, &out}, "attention_forward: q, k, v, out must be all f32 or all bf16");
  SY_CHECK_MSG(lse.dtype() == DType::kF32, "attention_forward: lse must be f32");
  const cpu::AttentionShape s = check_qkv(q, k, v);
  SY_CHECK_MSG(out.shape() == q.shape(), "attention_forward: out must be shaped like q");
  SY_CHECK_MSG(lse.shape() == lse_shape(s), "attention_forward: lse must be (batch, heads, seq)");
  const int32_t* starts = checked_doc_starts(doc_starts, s);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "attention_forward", {&q, &k, &v, &out, &lse});
    if (starts) op_stream(dev, "attention_forward", {&doc_starts});
    with_cuda_type(q, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::attention_forward<T>(cuda_data<T>(q), cuda_data<T>(k), cuda_data<T>(v), cuda_shape(s),
                                 starts, cuda_data<T>(out), lse.data<float>(), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "attention_forward: this build has no CUDA backend");
  if (q.dtype() == DType::kBF16) {
    Tensor result = f32_result(out);
    attention_forward(dev, widened(q), widened(k), widened(v), result, lse, doc_starts);
    store(dev, result, out);
    return;
  }
  cpu::attention_forward<float>(q.data<float>(), k.data<float>(), v.data<float>(), s,
                                out.data<float>(), lse.data<float>(), starts);
}

void attention_backward(Device& dev, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                        Tensor& dk, Tensor& dv, const Tensor& doc_starts) {
  const OpScope scope(OpKind::kAttentionCore, OpPass::kBackward, dev);
  check_dtypes({&dout, &q, &k, &v, &out, &dq, &dk, &dv},
               "attention_backward: dout, q, k, v, out, dq, dk, dv must be all f32 or all bf16");
  SY_CHECK_MSG(lse.dtype() == DType::kF32, "attention_backward: lse must be f32");
  const cpu::AttentionShape s = check_qkv(q, k, v);
  SY_CHECK_MSG(dout.shape() == q.shape() && out.shape() == q.shape(),
               "attention_backward: dout and out must be shaped like q");
  SY_CHECK_MSG(lse.shape() == lse_shape(s), "attention_backward: lse must be (batch, heads, seq)");
  SY_CHECK_MSG(dq.shape() == q.shape() && dk.shape() == k.shape() && dv.shape() == v.shape(),
               "attention_backward: gradient shapes do not match q, k, v");
  const int32_t* starts = checked_doc_starts(doc_starts, s);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream =
        op_stream(dev, "attention_backward", {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
    if (starts) op_stream(dev, "attention_backward", {&doc_starts});
    with_cuda_type(q, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::attention_backward<T>(cuda_data<T>(dout), cuda_data<T>(q), cuda_data<T>(k),
                                  cuda_data<T>(v), cuda_data<T>(out), lse.data<float>(),
                                  cuda_shape(s), starts, cuda_data<T>(dq), cuda_data<T>(dk),
                                  cuda_data<T>(dv), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "attention_backward: this build has no CUDA backend");
  if (q.dtype() == DType::kBF16) {
    Tensor dq32 = f32_result(dq), dk32 = f32_result(dk), dv32 = f32_result(dv);
    attention_backward(dev, widened(dout), widened(q), widened(k), widened(v), widened(out), lse,
                       dq32, dk32, dv32, doc_starts);
    store(dev, dq32, dq);
    store(dev, dk32, dk);
    store(dev, dv32, dv);
    return;
  }
  cpu::attention_backward<float>(dout.data<float>(), q.data<float>(), k.data<float>(),
                                 v.data<float>(), out.data<float>(), lse.data<float>(), s,
                                 dq.data<float>(), dk.data<float>(), dv.data<float>(), starts);
}

}  // namespace switchyard
