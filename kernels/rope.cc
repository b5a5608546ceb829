#include "kernels/rope.h"

#include "kernels/convert.h"
#include "kernels/cpu/rope.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/rope.h"
#endif

namespace switchyard {
namespace {

void check_rope_operands(const char* op, const Tensor& table, const Tensor& x) {
  SY_CHECK_MSG(x.rank() == 4 && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16), op);
  SY_CHECK_MSG(table.dtype() == DType::kF32, "rope: the table must be f32");
  SY_CHECK_MSG(x.dim(3) % 2 == 0, "rope: head_dim must be even");
  SY_CHECK_MSG(table.rank() == 3 && table.dim(0) >= x.dim(1) && table.dim(1) == x.dim(3) / 2 &&
                   table.dim(2) == 2,
               "rope: table does not cover (seq, head_dim/2, 2)");
}

#ifdef SWITCHYARD_WITH_CUDA
// x rotated in place on the device (the inverse rotation for the backward).
void cuda_rope_rotate(const Tensor& table, Tensor& x, bool inverse, cudaStream_t stream) {
  with_cuda_type(x, [&](auto type) {
    using T = typename decltype(type)::type;
    cuda::rope_rotate(table.data<float>(), cuda_data<T>(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                      inverse, stream);
  });
}
#endif

}  // namespace

Tensor rope_table(int64_t seq, int64_t head_dim, float theta) {
  SY_CHECK_MSG(seq >= 0 && head_dim > 0 && head_dim % 2 == 0,
               "rope_table: head_dim must be positive and even");
  Tensor table = Tensor::empty({seq, head_dim / 2, 2});
  cpu::rope_table<float>(seq, head_dim, theta, table.data<float>());
  return table;
}

// On CUDA the table must be on the device too (a copy of rope_table's host tensor).
void rope_forward(Device& dev, const Tensor& table, Tensor& x) {
  check_rope_operands("rope_forward: x must be f32 or bf16 (batch, seq, heads, head_dim)", table,
                      x);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda_rope_rotate(table, x, false, op_stream(dev, "rope_forward", {&table, &x}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rope_forward: this build has no CUDA backend");
  if (any_bf16({&x})) {
    Tensor values = widened(x);
    rope_forward(dev, table, values);
    store(dev, values, x);
    return;
  }
  cpu::rope_forward<float>(table.data<float>(), x.data<float>(), x.dim(0), x.dim(1), x.dim(2),
                           x.dim(3));
}

void rope_backward(Device& dev, const Tensor& table, Tensor& dx) {
  check_rope_operands("rope_backward: dx must be f32 or bf16 (batch, seq, heads, head_dim)", table,
                      dx);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda_rope_rotate(table, dx, true, op_stream(dev, "rope_backward", {&table, &dx}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rope_backward: this build has no CUDA backend");
  if (any_bf16({&dx})) {
    Tensor values = widened(dx);
    rope_backward(dev, table, values);
    store(dev, values, dx);
    return;
  }
  cpu::rope_backward<float>(table.data<float>(), dx.data<float>(), dx.dim(0), dx.dim(1), dx.dim(2),
                            dx.dim(3));
}

}  // namespace switchyard
