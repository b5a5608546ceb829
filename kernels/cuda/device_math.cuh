// Scalar math shared by the CUDA kernels, in float.
#pragma once

namespace switchyard::cuda {

// Logistic sigmoid through exp(-|x|), so it never overflows (as the CPU kernels do).
__device__ inline float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float inv = 1.0f / (1.0f + e);
  return x >= 0.0f ? inv : e * inv;
}

}  // namespace switchyard::cuda
