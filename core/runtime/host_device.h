// SY_HOST_DEVICE marks a function that host code and device code compiled by nvcc both
// call, so the CPU and CUDA kernels share one definition.
#pragma once

#if defined(__CUDACC__)
#define SY_HOST_DEVICE __host__ __device__
#else
#define SY_HOST_DEVICE
#endif
