// The CUDA device: allocation through the CUDA runtime, the stream every op runs on, the
// cuBLAS handle bound to it and the state of the matrix products on it. Only compiled
// when the build has CUDA (SWITCHYARD_CUDA=ON).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "core/runtime/device.h"
#include "core/runtime/tensor.h"

namespace switchyard {
namespace cuda {
class Blas;
}

// Number of visible CUDA devices; 0 when there is no driver or no GPU.
int cuda_device_count();

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceType type() const override { return DeviceType::kCuda; }
  int index() const override { return index_; }
  std::string name() const override;
  void synchronize() override;
  // cudaMemGetInfo's free bytes.
  int64_t available_bytes() const override;

  struct Properties {
    int major = 0, minor = 0;  // compute capability
    int multiprocessors = 0;
    int clock_khz = 0;  // peak SM clock
  };
  Properties properties() const;
  // cudaMemcpyAsync / cudaMemsetAsync on stream().
  void copy_within(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;

  // The stream all ops on this device run on, in issue order; made current with the
  // device on every call and created on the first. It is a blocking stream: work on the
  // legacy default stream (a plain cudaMemcpy, cudaMemset) stays ordered with it.
  cudaStream_t stream();
  // cuBLAS handle on stream(), created on the first call. Its default math mode with
  // CUBLAS_COMPUTE_32F gives full fp32 products (no TF32).
  cublasHandle_t cublas();
  // What the matrix products run with (kernels/cuda/gemm.h): that cuBLAS handle, a
  // cuBLASLt handle, its workspace and the plans chosen per product shape; created on
  // the first call.
  cuda::Blas& blas();

 protected:
  // Each waits for the stream: for the bytes to arrive, or for pageable `src` to be read.
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;

 private:
  int index_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<cuda::Blas> blas_;
};

// `device` as the CUDA device it must be.
CudaDevice& as_cuda(Device& device);

// The stream op `op` runs on, after checking that every tensor it reads or writes lives
// on `device`: ops never move data between devices behind the caller's back.
cudaStream_t op_stream(Device& device, const char* op,
                       std::initializer_list<const Tensor*> tensors);
// The same check, for the matrix products: the device's Blas, on that stream.
cuda::Blas& op_blas(Device& device, const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace switchyard
