// From a Tensor's dtype to the CUDA element type the kernels are instantiated for
// (float or __nv_bfloat16), for the ops' CUDA branches in kernels/<op>.cc.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "core/runtime/tensor.h"

namespace switchyard {

// Calls f with std::type_identity of the CUDA element type holding `t`'s dtype (already
// checked to be f32 or bf16).
template <typename F>
void with_cuda_type(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kBF16)
    f(std::type_identity<__nv_bfloat16>{});
  else
    f(std::type_identity<float>{});
}

// The same for two tensors whose dtypes are chosen independently.
template <typename F>
void with_cuda_types(const Tensor& a, const Tensor& b, F&& f) {
  with_cuda_type(a,
                 [&](auto a_type) { with_cuda_type(b, [&](auto b_type) { f(a_type, b_type); }); });
}

// The storage of `t` as T, the CUDA element type of its dtype.
template <typename T>
T* cuda_data(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace switchyard
