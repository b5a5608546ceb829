// Launch geometry shared by the CUDA kernels, and the device-side invariant check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace switchyard::cuda {

// Threads per block of the elementwise and per-row kernels (a multiple of the warp size,
// which the block reductions rely on).
inline constexpr int kThreads = 256;
// At most this many blocks per grid-stride launch: enough to fill any current GPU, and
// every index stays far from overflow.
inline constexpr int64_t kMaxBlocks = 1 << 16;

// Blocks for a grid-stride loop over `items` with `threads` per block; 0 when there is
// no work (a zero-block launch is an error, so callers skip it).
inline unsigned int grid_blocks(int64_t items, int threads = kThreads) {
  return static_cast<unsigned int>(std::min(kMaxBlocks, (items + threads - 1) / threads));
}

// First index and stride of a grid-stride loop.
__device__ inline int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace switchyard::cuda

// Stops the kernel when a data-dependent invariant fails (an index out of range), after
// printing it. The trap leaves a sticky error, so the next checked CUDA call on the device
// aborts the process instead of letting a wild write corrupt memory.
#define SY_DEVICE_CHECK(cond, message)                                                       \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      printf("switchyard: device check failed at %s:%d: %s\n", __FILE__, __LINE__, message); \
      __trap();                                                                              \
    }                                                                                        \
  } while (0)
