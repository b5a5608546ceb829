#include "kernels/cuda/rope.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// One thread per (batch, position, head, pair): rotates channels i and i + half.
template <typename T>
__global__ void rope_rotate_kernel(const float* table, T* x, int64_t batch, int64_t seq,
                                   int64_t heads, int64_t half, float sign) {
  const int64_t pairs = batch * seq * heads * half;
  for (int64_t p = grid_start(); p < pairs; p += grid_stride()) {
    const int64_t i = p % half;
    const int64_t row = p / half;  // (batch, position, head)
    const int64_t position = (row / heads) % seq;
    const float c = table[(position * half + i) * 2];
    const float s = sign * table[(position * half + i) * 2 + 1];
    T* lo = x + row * 2 * half + i;
    T* hi = lo + half;
    const float a = static_cast<float>(*lo);
    const float b = static_cast<float>(*hi);
    *lo = static_cast<T>(a * c - b * s);
    *hi = static_cast<T>(b * c + a * s);
  }
}

}  // namespace

template <typename T>
void rope_rotate(const float* table, T* x, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, bool inverse, cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  const int64_t pairs = batch * seq * heads * half;
  if (pairs == 0) return;
  rope_rotate_kernel<<<grid_blocks(pairs), kThreads, 0, stream>>>(table, x, batch, seq, heads, half,
                                                                  inverse ? -1.0f : 1.0f);
  SY_CUDA_CHECK_LAUNCH();
}

template void rope_rotate<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t, bool,
                                 cudaStream_t);
template void rope_rotate<__nv_bfloat16>(const float*, __nv_bfloat16*, int64_t, int64_t, int64_t,
                                         int64_t, bool, cudaStream_t);

}  // namespace switchyard::cuda
