// CUDA rotary position embedding (twin of kernels/cpu/rope.h), "rotate half" convention.
#pragma once

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
