// A Device owns allocation (with per-category accounting), and later streams and BLAS
// handles. Ops receive the Device explicitly so that one model code path serves every
// backend.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace switchyard {

enum class DeviceType { kCpu, kCuda };

// What an allocation holds; the memory report is broken down by these. Parameters,
// their gradients and optimizer state are counted apart for dense and expert
// parameters, since ZeRO shards the one and expert parallelism the other.
enum class MemoryKind : int {
  kParameters,
  kGradients,
  kOptimizerState,
  kExpertParameters,
  kExpertGradients,
  kExpertOptimizerState,
  kActivations,
  kOther
};
inline constexpr int kNumMemoryKinds = 8;
const char* memory_kind_name(MemoryKind kind);

struct MemoryStats {
  std::array<int64_t, kNumMemoryKinds> current_bytes{};
  std::array<int64_t, kNumMemoryKinds> peak_bytes{};
  int64_t total_peak_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType type() const = 0;
  virtual int index() const { return 0; }
  virtual std::string name() const = 0;
  bool is_cuda() const { return type() == DeviceType::kCuda; }

  void* allocate(size_t bytes, MemoryKind kind);
  void deallocate(void* ptr, size_t bytes, MemoryKind kind);
  // Blocks until queued work is done (no-op on the CPU).
  virtual void synchronize() {}
  // Bytes this device can still allocate, as the system reports it (-1: unknown). A run
  // that needs more is refused before it allocates anything.
  virtual int64_t available_bytes() const { return -1; }

  // Byte copies between this device's memory and host memory, or within this device,
  // ordered after the work already queued on the device. A copy to the host returns
  // once the bytes have arrived; a copy from the host once `src` may be reused. Tensor
  // copies and zeroing go through these, so runtime code moves data without knowing
  // the backend.
  void copy_from_host(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    host_transfers_.fetch_add(1, std::memory_order_relaxed);
    upload(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    host_transfers_.fetch_add(1, std::memory_order_relaxed);
    download(dst, src, bytes);
  }
  virtual void copy_within(void* dst, const void* src, size_t bytes);
  virtual void fill_zero(void* dst, size_t bytes);
  // Copies between this device and the host so far. On a GPU each one waits for the
  // work queued before it, so a training step keeps them few and independent of its
  // number of layers (tests/model/host_transfers_test.cc).
  int64_t host_transfers() const { return host_transfers_.load(std::memory_order_relaxed); }

  // Allocation and accounting are safe from several threads (gradient reductions run
  // beside the compute); read the statistics while no other thread allocates.
  const MemoryStats& memory_stats() const { return stats_; }
  void reset_peak_memory();

 protected:
  // The copies behind copy_from_host and copy_to_host (plain memory copies by default);
  // `bytes` > 0.
  virtual void upload(void* dst, const void* src, size_t bytes);
  virtual void download(void* dst, const void* src, size_t bytes);
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_deallocate(void* ptr) = 0;

 private:
  std::mutex stats_mutex_;
  MemoryStats stats_;
  int64_t total_current_bytes_ = 0;
  std::atomic<int64_t> host_transfers_{0};
};

class CpuDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kCpu; }
  std::string name() const override { return "cpu"; }
  // MemAvailable of /proc/meminfo.
  int64_t available_bytes() const override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;
};

// The process-wide CPU device.
Device& cpu_device();

// Refuses, before anything is allocated, a need of `bytes` that is more than `dev` has
// available; `what` names what needs it ("the run's parameters, ...": the subject of the
// error).
absl::Status check_fits(Device& dev, double bytes, const std::string& what);

}  // namespace switchyard
