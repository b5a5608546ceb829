#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <new>

#include "engine/runtime/check.h"

#define SY_CUDA_CHECK(expr)                                                             \
  do {                                                                                  \
    cudaError_t sy_err_ = (expr);                                                       \
    if (sy_err_ != cudaSuccess)                                                         \
      ::switchyard::internal::check_failed(__FILE__, __LINE__, #expr,                   \
                                           cudaGetErrorString(sy_err_));                \
  } while (0)

namespace switchyard {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

CudaDevice::CudaDevice(int index) : index_(index) { SY_CUDA_CHECK(cudaSetDevice(index)); }

std::string CudaDevice::name() const { return "cuda:" + std::to_string(index_); }

void CudaDevice::synchronize() {
  SY_CUDA_CHECK(cudaSetDevice(index_));
  SY_CUDA_CHECK(cudaDeviceSynchronize());
}

void* CudaDevice::raw_allocate(size_t bytes) {
  void* ptr = nullptr;
  SY_CUDA_CHECK(cudaSetDevice(index_));
  if (cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) != cudaSuccess) throw std::bad_alloc();
  return ptr;
}

void CudaDevice::raw_deallocate(void* ptr) { SY_CUDA_CHECK(cudaFree(ptr)); }

void cuda_copy_to_device(Device& device, void* dst, const void* src, size_t bytes) {
  SY_CUDA_CHECK(cudaSetDevice(device.index()));
  SY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void cuda_copy_to_host(Device& device, void* dst, const void* src, size_t bytes) {
  SY_CUDA_CHECK(cudaSetDevice(device.index()));
  SY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace switchyard
