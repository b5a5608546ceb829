// Temporary device memory for one op, ordered on its stream (cudaMallocAsync from the
// device's pool): allocating and freeing it queues behind the op's kernels and costs no
// device-wide synchronisation, unlike cudaMalloc/cudaFree.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"

namespace switchyard::cuda {

template <typename T>
class Scratch {
 public:
  Scratch(int64_t count, cudaStream_t stream) : stream_(stream) {
    if (count > 0)
      SY_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_),
                                    static_cast<size_t>(count) * sizeof(T), stream));
  }
  ~Scratch() {
    if (data_) SY_CUDA_CHECK(cudaFreeAsync(data_, stream_));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  T* get() const { return data_; }

 private:
  cudaStream_t stream_;
  T* data_ = nullptr;
};

}  // namespace switchyard::cuda
