#include "kernels/devices.h"

#include <mutex>
#include <vector>

#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {

bool built_with_cuda() {
#ifdef SWITCHYARD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int visible_gpus() {
#ifdef SWITCHYARD_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

Device* select_device(const std::string& wanted, int local_rank, std::string* error) {
  if (wanted == "cpu") return &cpu_device();
  if (wanted != "cuda" && !wanted.empty()) {
    *error = "runtime.device must be \"cpu\", \"cuda\" or empty, not \"" + wanted + "\"";
    return nullptr;
  }
  const int gpus = visible_gpus();
  if (gpus == 0) {
    if (wanted.empty()) return &cpu_device();
    *error = built_with_cuda()
                 ? "runtime.device=cuda, but no CUDA device is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)"
                 : "runtime.device=cuda, but this build has no CUDA backend (configure with "
                   "-DSWITCHYARD_CUDA=ON)";
    return nullptr;
  }
#ifdef SWITCHYARD_WITH_CUDA
  // Never destroyed: a static destructor would run after the CUDA runtime has begun
  // to unload at exit, and its stream and cuBLAS teardown would then fail.
  static std::mutex mutex;
  static std::vector<CudaDevice*> devices(gpus, nullptr);
  std::lock_guard<std::mutex> lock(mutex);
  CudaDevice*& device = devices[local_rank % gpus];
  if (!device) device = new CudaDevice(local_rank % gpus);
  return device;
#else
  return nullptr;
#endif
}

DType working_dtype(const std::string& wanted, const Device& device) {
  return working_dtype(wanted, device.is_cuda());
}

DType working_dtype(const std::string& wanted, bool on_gpu) {
  return wanted == "bf16" || (wanted.empty() && on_gpu) ? DType::kBF16 : DType::kF32;
}

double bf16_peak_flops(Device& device) {
#ifdef SWITCHYARD_WITH_CUDA
  if (!device.is_cuda()) return 0;
  const CudaDevice::Properties p = as_cuda(device).properties();
  double flops_per_clock = 0;
  if (p.major == 9)
    flops_per_clock = 4096;
  else if (p.major == 8 && p.minor == 0)
    flops_per_clock = 2048;
  else if (p.major == 8)
    flops_per_clock = 1024;
  return flops_per_clock * p.multiprocessors * p.clock_khz * 1e3;
#else
  (void)device;
  return 0;
#endif
}

std::string gpu_model_name(Device& device) {
#ifdef SWITCHYARD_WITH_CUDA
  cudaDeviceProp properties{};
  if (device.is_cuda() && cudaGetDeviceProperties(&properties, device.index()) == cudaSuccess)
    return properties.name;
#else
  (void)device;
#endif
  return "";
}

}  // namespace switchyard
