// The peak arithmetic rate behind the MFU figure, and where it came from: --peak-gflops;
// on a GPU the device's dense bf16 peak from a table of known devices; on the CPU an
// sgemm calibration through the engine's own matrix product, cached per machine in
// ~/.cache/switchyard/peak.json (docs/training.md, "Reading the progress line").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/runtime/device.h"
#include "engine/train/peak_cache.h"

namespace switchyard {

struct Peak {
  double flops = 0;    // FLOP/s of all the ranks together; 0: unknown (the MFU reads 0)
  std::string source;  // how it was found: "measured (sgemm, 2 threads, cached)"
};

// "peak 407 GFLOP/s measured (sgemm, 2 threads, cached)", for the start of a run.
std::string peak_line(const Peak& peak);

struct PeakOptions {
  double flops = 0;        // --peak-gflops x 1e9 (all the ranks together); 0: find it
  std::string cache_path;  // the CPU calibration's cache; "": measure every time
  std::string build;       // this binary's build (version, commit), part of the cache key
};

// A GPU's dense bf16 peak for `ranks` ranks like `dev`: known_gpu_bf16_peak_flops by its
// name, else bf16_peak_flops' estimate from its multiprocessors and clock. The one GPU
// peak behind every MFU the trainer and the GPU benchmarks print.
Peak gpu_peak(Device& dev, int ranks);

// The peak for `ranks` ranks on devices like `dev`: options.flops when given, a GPU's
// (known_gpu_bf16_peak_flops, else bf16_peak_flops' estimate from its multiprocessors
// and clock), or the CPU's cpu_peak_flops with the current CPU threads. A damaged cache
// is one warning line in *warning (else ""), and the peak is measured again.
Peak find_peak(const PeakOptions& options, Device& dev, int ranks, std::string* warning);

// Dense bf16 tensor-core FLOP/s of a GPU by the name cudaGetDeviceProperties gives it
// ("NVIDIA H100 80GB HBM3"); 0 for a device outside the table.
double known_gpu_bf16_peak_flops(absl::string_view device_name);

// ~/.cache/switchyard/peak.json; "" when HOME is unset.
std::string default_peak_cache_path();
// This CPU's "model name" from /proc/cpuinfo ("unknown CPU" when it cannot be read).
std::string cpu_model_name();
// What a cached peak is valid for: the CPU model, its logical CPUs, the threads the
// calibration used and the build.
std::string cpu_peak_key(absl::string_view cpu_model, int cpus, int threads,
                         absl::string_view build);

// A calibration: the best FLOP/s of square sgemm products through the engine's matmul
// on the CPU with the current CPU threads, in at most about 0.3 s, and the share of all
// the CPUs' time that other work (other processes, a hypervisor's steal) took meanwhile
// (-1: unknown, without /proc/stat).
struct SgemmMeasurement {
  double flops = 0;
  double others_share = -1;
};
SgemmMeasurement measure_sgemm();

// A calibration during which other work took more of the CPUs than this reads low:
// it serves its run but is not cached.
inline constexpr double kMaxOthersShareToCache = 0.1;

// The CPU's peak for one rank with `threads` threads: the cached value under its key,
// else a fresh `measure()`, stored in the cache unless the machine was busy (a cache
// that cannot be written costs only the next run's calibration).
Peak cpu_peak_flops(const std::string& cache_path, const std::string& build, int threads,
                    std::string* warning,
                    const std::function<SgemmMeasurement()>& measure = measure_sgemm);

}  // namespace switchyard
