// CUDA SwiGLU kernels (twins of kernels/cpu/swiglu.h) on a fused gate/up row: gate in
// [0, I), up in [I, 2I). Templates on the element type, instantiated for float and
// __nv_bfloat16: elements are loaded as float, the arithmetic runs in float and each
// stored element is rounded once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// gate_up: (rows, 2I) -> out: (rows, I) = silu(gate) * up.
template <typename T>
void swiglu_forward(const T* gate_up, T* out, int64_t rows, int64_t inter, cudaStream_t stream);
// dgate_up: (rows, 2I) written.
template <typename T>
void swiglu_backward(const T* dout, const T* gate_up, T* dgate_up, int64_t rows, int64_t inter,
                     cudaStream_t stream);

}  // namespace switchyard::cuda
