#include "kernels/cuda/swiglu.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate_up, T* out, int64_t rows, int64_t inter) {
  for (int64_t p = grid_start(); p < rows * inter; p += grid_stride()) {
    const int64_t r = p / inter;
    const int64_t i = p % inter;
    const float gate = static_cast<float>(gate_up[r * 2 * inter + i]);
    const float up = static_cast<float>(gate_up[r * 2 * inter + inter + i]);
    out[p] = static_cast<T>(gate * sigmoid(gate) * up);
  }
}

// silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
template <typename T>
__global__ void swiglu_backward_kernel(const T* dout, const T* gate_up, T* dgate_up, int64_t rows,
                                       int64_t inter) {
  for (int64_t p = grid_start(); p < rows * inter; p += grid_stride()) {
    const int64_t gate_at = (p / inter) * 2 * inter + p % inter;
    const float a = static_cast<float>(gate_up[gate_at]);
    const float up = static_cast<float>(gate_up[gate_at + inter]);
    const float d = static_cast<float>(dout[p]);
    const float s = sigmoid(a);
    dgate_up[gate_at] = static_cast<T>(d * up * s * (1.0f + a * (1.0f - s)));
    dgate_up[gate_at + inter] = static_cast<T>(d * a * s);
  }
}

}  // namespace

template <typename T>
void swiglu_forward(const T* gate_up, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows * inter == 0) return;
  swiglu_forward_kernel<<<grid_blocks(rows * inter), kThreads, 0, stream>>>(gate_up, out, rows,
                                                                            inter);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(const T* dout, const T* gate_up, T* dgate_up, int64_t rows, int64_t inter,
                     cudaStream_t stream) {
  if (rows * inter == 0) return;
  swiglu_backward_kernel<<<grid_blocks(rows * inter), kThreads, 0, stream>>>(dout, gate_up,
                                                                             dgate_up, rows, inter);
  SY_CUDA_CHECK_LAUNCH();
}

#define SY_INSTANTIATE_SWIGLU(T)                                                 \
  template void swiglu_forward<T>(const T*, T*, int64_t, int64_t, cudaStream_t); \
  template void swiglu_backward<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);
SY_INSTANTIATE_SWIGLU(float)
SY_INSTANTIATE_SWIGLU(__nv_bfloat16)
#undef SY_INSTANTIATE_SWIGLU

}  // namespace switchyard::cuda
