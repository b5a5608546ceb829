#include "engine/train/peak.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/runtime/tensor.h"
#include "kernels/devices.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// Dense bf16 tensor-core peaks (without sparsity) from the vendors' data sheets, in
// TFLOP/s. The first entry whose text the device name contains wins, so the more
// specific names come first.
struct KnownGpu {
  const char* name_part;
  double tflops;
};
constexpr KnownGpu kKnownGpus[] = {
    {"GH200", 989},     {"H200 NVL", 835}, {"H200", 989},       {"H100 PCIe", 756},
    {"H100 NVL", 835},  {"H100", 989},     {"H800 PCIe", 756},  {"H800", 989},
    {"B200", 2250},     {"B100", 1750},    {"A100", 312},       {"A800", 312},
    {"L40S", 362},      {"L40", 181},      {"L4", 121},         {"A10G", 70},
    {"A10", 125},       {"A30", 165},      {"RTX 6000 Ada", 364}, {"RTX A6000", 155},
};

// CPU seconds every process of the machine has run (user, nice, system, interrupts,
// steal), from /proc/stat; -1 when it cannot be read.
double busy_cpu_seconds() {
  std::ifstream stat("/proc/stat");
  std::string label;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(stat >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      label != "cpu")
    return -1;
  return static_cast<double>(user + nice + system + irq + softirq + steal) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds of this process, all its threads.
double own_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace

std::string peak_line(const Peak& peak) {
  if (peak.flops <= 0) return absl::StrCat("peak unknown (", peak.source, "): mfu reads 0");
  return absl::StrFormat("peak %.0f GFLOP/s %s", peak.flops / 1e9, peak.source);
}

double known_gpu_bf16_peak_flops(absl::string_view device_name) {
  for (const KnownGpu& gpu : kKnownGpus)
    if (absl::StrContains(device_name, gpu.name_part)) return gpu.tflops * 1e12;
  return 0;
}

std::string default_peak_cache_path() {
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return "";
  return (fs::path(home) / ".cache" / "switchyard" / "peak.json").string();
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "model name")) continue;
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (absl::ConsumePrefix(&rest, ":")) return std::string(absl::StripAsciiWhitespace(rest));
  }
  return "unknown CPU";
}

std::string cpu_peak_key(absl::string_view cpu_model, int cpus, int threads,
                         absl::string_view build) {
  return absl::StrCat(cpu_model, " | ", cpus, " CPUs | ", threads, " threads | ", build);
}

SgemmMeasurement measure_sgemm() {
  constexpr int64_t n = 1024;
  constexpr int kMaxProducts = 24;
  constexpr double kBudgetSeconds = 0.3;
  std::vector<Tensor> operands;
  for (int i = 0; i < 3; ++i) {
    operands.push_back(Tensor::empty({n, n}));
    float* values = operands.back().data<float>();
    for (int64_t e = 0; e < n * n; ++e) values[e] = static_cast<float>((e * 7 + i) % 13) / 13.0f;
  }
  using clock = std::chrono::steady_clock;
  matmul(cpu_device(), operands[0], false, operands[1], false, operands[2]);  // warm up
  const double busy_before = busy_cpu_seconds();
  const double own_before = own_cpu_seconds();
  const auto start = clock::now();
  double best_seconds = 0;
  for (int i = 0; i < kMaxProducts; ++i) {
    const auto before = clock::now();
    matmul(cpu_device(), operands[0], false, operands[1], false, operands[2]);
    const double seconds = std::chrono::duration<double>(clock::now() - before).count();
    if (best_seconds == 0 || seconds < best_seconds) best_seconds = seconds;
    if (std::chrono::duration<double>(clock::now() - start).count() > kBudgetSeconds) break;
  }
  SgemmMeasurement m;
  m.flops = best_seconds > 0 ? 2.0 * n * n * n / best_seconds : 0;
  const double wall = std::chrono::duration<double>(clock::now() - start).count();
  const double busy_after = busy_cpu_seconds();
  const unsigned cpus = std::thread::hardware_concurrency();
  if (busy_before >= 0 && busy_after >= 0 && wall > 0 && cpus > 0)
    m.others_share = std::max(
        0.0, (busy_after - busy_before - (own_cpu_seconds() - own_before)) / (wall * cpus));
  return m;
}

Peak cpu_peak_flops(const std::string& cache_path, const std::string& build, int threads,
                    std::string* warning, const std::function<SgemmMeasurement()>& measure) {
  const std::string key = cpu_peak_key(
      cpu_model_name(), static_cast<int>(std::thread::hardware_concurrency()), threads, build);
  const std::string how = absl::StrCat("measured (sgemm, ", threads, " threads");
  PeakCache cache;
  warning->clear();
  if (!cache_path.empty()) cache = read_peak_cache(cache_path, warning);
  if (const auto it = cache.find(key); it != cache.end())
    return {it->second * 1e9, absl::StrCat(how, ", cached)")};
  const SgemmMeasurement m = measure();
  if (m.others_share > kMaxOthersShareToCache)
    return {m.flops, absl::StrFormat("%s; other work took %.0f%% of the CPUs meanwhile: not "
                                     "cached)",
                                     how, 100.0 * m.others_share)};
  if (cache_path.empty() || m.flops <= 0) return {m.flops, absl::StrCat(how, ")")};
  if (cache.size() >= kMaxPeakCacheEntries) cache.clear();
  cache[key] = m.flops / 1e9;
  const absl::Status written = write_peak_cache(cache_path, cache);
  if (!written.ok() && warning->empty())
    *warning = absl::StrCat("warning: ", written.message(), "; the peak is not cached");
  return {m.flops, absl::StrCat(how, ")")};
}

Peak gpu_peak(Device& dev, int ranks) {
  const std::string name = gpu_model_name(dev);
  const std::string times = absl::StrCat(" x ", ranks, ranks == 1 ? " rank" : " ranks");
  if (const double known = known_gpu_bf16_peak_flops(name); known > 0)
    return {known * ranks, absl::StrCat(name, " dense bf16", times)};
  return {bf16_peak_flops(dev) * ranks,
          absl::StrCat(name, " dense bf16 estimated from multiprocessors x clock", times)};
}

Peak find_peak(const PeakOptions& options, Device& dev, int ranks, std::string* warning) {
  warning->clear();
  if (options.flops > 0) return {options.flops, "from --peak-gflops"};
  if (dev.is_cuda()) return gpu_peak(dev, ranks);
  Peak peak = cpu_peak_flops(options.cache_path, options.build, cpu_threads(), warning);
  if (ranks > 1) absl::StrAppend(&peak.source, " x ", ranks, " ranks");
  peak.flops *= ranks;
  return peak;
}

}  // namespace switchyard
