#include "kernels/convert.h"

#include "kernels/cpu/elementwise.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {
void convert(Device& dev, const Tensor& src, Tensor& dst) {
  const bool counts = src.dtype() == DType::kI32 && dst.dtype() == DType::kF32;
  SY_CHECK_MSG((is_float(src) && is_float(dst)) || counts,
               "convert: f32 and bf16 tensors, or i32 to f32, only");
  SY_CHECK_MSG(src.numel() == dst.numel(), "convert: the tensors differ in size");
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
    return;
  }
  const int64_t n = src.numel();
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "convert", {&src, &dst});
    if (counts)
      cuda::widen_from_i32(src.data<int32_t>(), dst.data<float>(), n, stream);
    else if (src.dtype() == DType::kF32)
      cuda::narrow_to_bf16(src.data<float>(), dst.raw_data(), n, stream);
    else
      cuda::widen_from_bf16(src.raw_data(), dst.data<float>(), n, stream);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "convert: this build has no CUDA backend");
  SY_CHECK_MSG(!src.device().is_cuda() && !dst.device().is_cuda(),
               "convert: a CUDA tensor given to the CPU op");
  if (counts) {
    const int32_t* s = src.data<int32_t>();
    float* d = dst.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
  } else if (src.dtype() == DType::kF32) {
    const float* s = src.data<float>();
    bf16* d = dst.data<bf16>();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
  } else {
    const bf16* s = src.data<bf16>();
    float* d = dst.data<float>();
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
  }
}

bool any_bf16(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t->defined() && t->dtype() == DType::kBF16) return true;
  return false;
}

bool is_float(const Tensor& t) { return t.dtype() == DType::kF32 || t.dtype() == DType::kBF16; }

Tensor f32_result(const Tensor& out) {
  if (out.dtype() == DType::kF32) return out;
  return Tensor::empty(out.shape(), DType::kF32, MemoryKind::kActivations, out.device());
}

Tensor widened(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor f32 = Tensor::empty(t.shape(), DType::kF32, MemoryKind::kActivations, t.device());
  convert(t.device(), t, f32);
  return f32;
}

void store(Device& dev, const Tensor& values, Tensor& out) {
  if (values.raw_data() == out.raw_data() && values.dtype() == out.dtype()) return;
  convert(dev, values, out);
}

}  // namespace switchyard
