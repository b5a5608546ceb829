// CUDA rotary position embedding (twin of kernels/cpu/rope.h), "rotate half" convention.
// A template on the element type of x, instantiated for float and __nv_bfloat16: x is
// loaded as float, rotated in float by the float table and rounded once when stored.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// x: (batch, seq, heads, head_dim) rotated in place by +angle, or by -angle when
// `inverse` (the backward: the rotation is orthogonal). table: (>= seq, head_dim/2, 2)
// of (cos, sin), on the device.
template <typename T>
void rope_rotate(const float* table, T* x, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, bool inverse, cudaStream_t stream);

}  // namespace switchyard::cuda
