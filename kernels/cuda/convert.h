// CUDA f32 <-> bf16 and i32 -> f32 conversions (twins of kernels/convert.cc's CPU
// loops): narrowing rounds to nearest even (__float2bfloat16_rn), widening is exact.
// Raw pointers to bf16 storage are void*, so host code needs no CUDA bf16 header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

void narrow_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream);
void widen_from_bf16(const void* src, float* dst, int64_t n, cudaStream_t stream);
void widen_from_i32(const int32_t* src, float* dst, int64_t n, cudaStream_t stream);

}  // namespace switchyard::cuda
