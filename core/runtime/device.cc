#include "core/runtime/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "absl/strings/str_format.h"

#include "core/runtime/check.h"

namespace switchyard {

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kParameters: return "parameters";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizerState: return "optimizer_state";
    case MemoryKind::kExpertParameters: return "expert_parameters";
    case MemoryKind::kExpertGradients: return "expert_gradients";
    case MemoryKind::kExpertOptimizerState: return "expert_optimizer_state";
    case MemoryKind::kActivations: return "activations";
    case MemoryKind::kOther: return "other";
  }
  return "unknown";
}

void* Device::allocate(size_t bytes, MemoryKind kind) {
  void* ptr = raw_allocate(bytes);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  int k = static_cast<int>(kind);
  stats_.current_bytes[k] += static_cast<int64_t>(bytes);
  stats_.peak_bytes[k] = std::max(stats_.peak_bytes[k], stats_.current_bytes[k]);
  total_current_bytes_ += static_cast<int64_t>(bytes);
  stats_.total_peak_bytes = std::max(stats_.total_peak_bytes, total_current_bytes_);
  return ptr;
}

void Device::deallocate(void* ptr, size_t bytes, MemoryKind kind) {
  raw_deallocate(ptr);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.current_bytes[static_cast<int>(kind)] -= static_cast<int64_t>(bytes);
  total_current_bytes_ -= static_cast<int64_t>(bytes);
}

void Device::upload(void* dst, const void* src, size_t bytes) { std::memmove(dst, src, bytes); }

void Device::download(void* dst, const void* src, size_t bytes) { std::memmove(dst, src, bytes); }

void Device::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

void Device::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void Device::reset_peak_memory() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.total_peak_bytes = total_current_bytes_;
}

void* CpuDevice::raw_allocate(size_t bytes) {
  // 64-byte alignment suits AVX-512 loads and cache lines.
  size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* ptr = std::aligned_alloc(64, rounded);
  if (ptr == nullptr) throw std::bad_alloc();
  return ptr;
}

void CpuDevice::raw_deallocate(void* ptr) { std::free(ptr); }

int64_t CpuDevice::available_bytes() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

absl::Status check_fits(Device& dev, double bytes, const std::string& what) {
  const int64_t available = dev.available_bytes();
  if (available < 0 || bytes <= static_cast<double>(available)) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s need at least %.1f GiB on %s, more than the %.1f GiB available there; use a "
      "smaller model or micro-batch, or more ranks (tensor, expert or data parallel with "
      "parallel.zero_stage)",
      what, bytes / kGiB, dev.name(), available / kGiB));
}

}  // namespace switchyard
