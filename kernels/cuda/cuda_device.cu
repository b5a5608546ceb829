#include "kernels/cuda/cuda_device.h"

#include <cstdint>
#include <new>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace switchyard {

// No GPU is two cases: none visible (cudaErrorNoDevice) and no driver installed at all
// (cudaErrorInsufficientDriver with driver version 0). Any other error, a driver older
// than the runtime among them, is a GPU that is there but unusable: it stops the process
// naming the error rather than reading as "no GPU", which would skip every GPU test.
int cuda_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) return count;
  cudaGetLastError();  // clear the error before deciding
  int driver = 0;
  const bool no_driver = err == cudaErrorInsufficientDriver &&
                         cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
  if (err == cudaErrorNoDevice || no_driver) return 0;
  internal::check_failed(__FILE__, __LINE__, "cudaGetDeviceCount", cudaGetErrorString(err));
}

CudaDevice::CudaDevice(int index) : index_(index) { SY_CUDA_CHECK(cudaSetDevice(index)); }

CudaDevice::~CudaDevice() {
  if (!stream_) return;
  SY_CUDA_CHECK(cudaSetDevice(index_));
  blas_.reset();  // before the handle and the stream it runs on
  if (cublas_) SY_CUBLAS_CHECK(cublasDestroy(cublas_));
  SY_CUDA_CHECK(cudaStreamDestroy(stream_));
}

std::string CudaDevice::name() const { return "cuda:" + std::to_string(index_); }

CudaDevice::Properties CudaDevice::properties() const {
  Properties p;
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&p.major, cudaDevAttrComputeCapabilityMajor, index_));
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&p.minor, cudaDevAttrComputeCapabilityMinor, index_));
  SY_CUDA_CHECK(
      cudaDeviceGetAttribute(&p.multiprocessors, cudaDevAttrMultiProcessorCount, index_));
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&p.clock_khz, cudaDevAttrClockRate, index_));
  return p;
}

void CudaDevice::synchronize() {
  SY_CUDA_CHECK(cudaSetDevice(index_));
  SY_CUDA_CHECK(cudaDeviceSynchronize());
}

cudaStream_t CudaDevice::stream() {
  SY_CUDA_CHECK(cudaSetDevice(index_));
  if (!stream_) {
    SY_CUDA_CHECK(cudaStreamCreate(&stream_));
    // Tensors and kernels' scratch come from the device's default pool (cudaMallocAsync); keep
    // freed blocks there instead of returning them to the driver at every synchronise.
    cudaMemPool_t pool = nullptr;
    SY_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    uint64_t keep_all = UINT64_MAX;
    SY_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }
  return stream_;
}

cublasHandle_t CudaDevice::cublas() {
  cudaStream_t s = stream();
  if (!cublas_) {
    SY_CUBLAS_CHECK(cublasCreate(&cublas_));
    SY_CUBLAS_CHECK(cublasSetStream(cublas_, s));
  }
  return cublas_;
}

cuda::Blas& CudaDevice::blas() {
  cublasHandle_t handle = cublas();
  if (!blas_) blas_ = std::make_unique<cuda::Blas>(handle, stream_);
  return *blas_;
}

// Stream-ordered, from the device's pool (which keeps freed blocks, see stream()): a
// step allocates and frees hundreds of activations, and cudaFree would wait for the
// whole device each time. Every use of the memory is ordered on stream() (other streams,
// such as a communicator's, are ordered against it by events).
void* CudaDevice::raw_allocate(size_t bytes) {
  void* ptr = nullptr;
  if (cudaMallocAsync(&ptr, bytes == 0 ? 1 : bytes, stream()) != cudaSuccess) {
    cudaGetLastError();  // out of memory is reported as bad_alloc, not left sticky
    throw std::bad_alloc();
  }
  return ptr;
}

int64_t CudaDevice::available_bytes() const {
  size_t free_bytes = 0, total_bytes = 0;
  SY_CUDA_CHECK(cudaSetDevice(index_));
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(free_bytes);
}

void CudaDevice::raw_deallocate(void* ptr) { SY_CUDA_CHECK(cudaFreeAsync(ptr, stream())); }

CudaDevice& as_cuda(Device& device) {
  SY_CHECK_MSG(device.is_cuda(), "expected a CUDA device");
  return static_cast<CudaDevice&>(device);
}

cudaStream_t op_stream(Device& device, const char* op,
                       std::initializer_list<const Tensor*> tensors) {
  CudaDevice& cuda = as_cuda(device);
  for (const Tensor* t : tensors) {
    if (!t->device().is_cuda() || t->device().index() != cuda.index()) {
      const std::string message = std::string(op) + ": a tensor is on " + t->device().name() +
                                  ", not on the op's device " + cuda.name();
      internal::check_failed(__FILE__, __LINE__, "tensor.device() == device", message.c_str());
    }
  }
  return cuda.stream();
}

cuda::Blas& op_blas(Device& device, const char* op, std::initializer_list<const Tensor*> tensors) {
  op_stream(device, op, tensors);
  return as_cuda(device).blas();
}

void CudaDevice::upload(void* dst, const void* src, size_t bytes) {
  SY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  // Pageable host memory may be reused as soon as this returns.
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::download(void* dst, const void* src, size_t bytes) {
  SY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  SY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void CudaDevice::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  SY_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

}  // namespace switchyard
