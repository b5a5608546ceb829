// CUDA column-block copies (twin of kernels/cpu/columns.h), instantiated for float and
// __nv_bfloat16; an accumulating copy adds in float and rounds once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// dst[r * ld_dst + j] = (or +=) src[r * ld_src + j] for r < rows, j < width, on the device.
template <typename T>
void copy_columns(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows,
                  int64_t width, bool accumulate, cudaStream_t stream);

}  // namespace switchyard::cuda
