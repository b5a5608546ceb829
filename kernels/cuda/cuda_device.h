// The CUDA device: allocation through the CUDA runtime. Only compiled when the build
// has CUDA (SWITCHYARD_CUDA=ON).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/device.h"

namespace switchyard {

// Number of visible CUDA devices; 0 when there is no driver or no GPU.
int cuda_device_count();

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);
  DeviceType type() const override { return DeviceType::kCuda; }
  int index() const override { return index_; }
  std::string name() const override;
  void synchronize() override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;

 private:
  int index_;
};

// Copies between host memory and device memory of `device` (blocking).
void cuda_copy_to_device(Device& device, void* dst, const void* src, size_t bytes);
void cuda_copy_to_host(Device& device, void* dst, const void* src, size_t bytes);

}  // namespace switchyard
