// The peak behind the MFU: the table of known GPUs and the CPU calibration's cache
// (an untrusted file: damaged or foreign entries mean a new measurement, never an error).
#include "engine/train/peak.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "kernels/threads.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

constexpr char kBuild[] = "switchyard test build";

class PeakCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string path() const { return (dir_ / "cache" / "peak.json").string(); }
  void write(const std::string& text) const {
    fs::create_directories(dir_ / "cache");
    std::ofstream(path()) << text;
  }
  static std::string this_machine() {
    return cpu_peak_key(cpu_model_name(), static_cast<int>(std::thread::hardware_concurrency()),
                        cpu_threads(), kBuild);
  }
  // A calibration on a quiet machine, without the 0.2 s of a real one.
  Peak peak(std::string* warning, SgemmMeasurement measured = {100e9, 0.02}) const {
    return cpu_peak_flops(path(), kBuild, cpu_threads(), warning,
                          [measured] { return measured; });
  }
  std::string measured_source() const {
    return "measured (sgemm, " + std::to_string(cpu_threads()) + " threads)";
  }
  fs::path dir_;
};

TEST(PeakTest, KnownGpusByName) {
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA L4"), 121e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("NVIDIA A10G"), 70e12);
  EXPECT_EQ(known_gpu_bf16_peak_flops("Tesla V100-SXM2-16GB"), 0);
}

TEST(PeakTest, OverrideAndLine) {
  std::string warning = "unset";
  const Peak given = find_peak({2.5e11, "", kBuild}, cpu_device(), 2, &warning);
  EXPECT_EQ(given.flops, 2.5e11);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(peak_line(given), "peak 250 GFLOP/s from --peak-gflops");
}

TEST(PeakTest, SgemmCalibrationIsQuickAndSaysHowBusyTheMachineWas) {
  const auto start = std::chrono::steady_clock::now();
  const SgemmMeasurement m = measure_sgemm();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_GT(m.flops, 1e8);
  EXPECT_GE(m.others_share, 0);  // /proc/stat is there on Linux
  EXPECT_LE(m.others_share, 1.5);
}

TEST_F(PeakCacheTest, MissingCacheIsMeasuredAndWritten) {
  std::string warning = "unset";
  const Peak measured = peak(&warning);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(measured.flops, 100e9);
  EXPECT_EQ(measured.source, measured_source());
  const PeakCache cache = read_peak_cache(path(), &warning);
  EXPECT_EQ(warning, "");
  ASSERT_EQ(cache.count(this_machine()), 1u);
  EXPECT_EQ(cache.at(this_machine()), 100);
}

TEST_F(PeakCacheTest, ACalibrationOnABusyMachineServesItsRunButIsNotCached) {
  std::string warning = "unset";
  const Peak measured = peak(&warning, {40e9, 0.35});
  EXPECT_EQ(warning, "");
  EXPECT_EQ(measured.flops, 40e9);
  EXPECT_EQ(measured.source, "measured (sgemm, " + std::to_string(cpu_threads()) +
                                 " threads; other work took 35% of the CPUs meanwhile: not "
                                 "cached)");
  EXPECT_FALSE(fs::exists(path()));
  EXPECT_EQ(peak(&warning).source, measured_source());
  EXPECT_EQ(peak(&warning).flops, 100e9);
}

TEST_F(PeakCacheTest, ValidEntryIsReused) {
  write("{\"" + this_machine() + "\": {\"gflops\": 123.5}}");
  std::string warning = "unset";
  const Peak cached = peak(&warning);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(cached.flops, 123.5e9);
  EXPECT_EQ(peak_line(cached), "peak 124 GFLOP/s measured (sgemm, " +
                                   std::to_string(cpu_threads()) + " threads, cached)");
}

TEST_F(PeakCacheTest, AnotherMachinesEntryMeansMeasuringAndKeepsIt) {
  const std::string other = cpu_peak_key("Other CPU", 64, 64, kBuild);
  write("{\"" + other + "\": {\"gflops\": 5000}}");
  std::string warning = "unset";
  const Peak measured = peak(&warning);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(measured.flops, 100e9);
  EXPECT_EQ(measured.source, measured_source());
  const PeakCache cache = read_peak_cache(path(), &warning);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.at(other), 5000);
}

TEST_F(PeakCacheTest, DamagedCachesAreWarnedAboutThenMeasuredAndRewritten) {
  const std::string key = this_machine();
  const struct {
    std::string text;
    std::string warning;
  } cases[] = {
      {"{\"" + key.substr(0, 10), "peak.json"},
      {"[1, 2]", "peak.json"},
      {"{\"" + key + "\": {\"gflops\": -4}}", "field " + key + ".gflops must be"},
      {"{\"" + key + "\": {\"gflops\": \"fast\"}}", "field " + key + ".gflops must be"},
      {"{\"" + key + "\": {\"gflops\": 1e400}}", "peak.json"},
      {"{\"" + key + "\": 7}", "field " + key + " must be an object"},
      {"{\"" + key + "\": {}}", "field " + key + ".gflops must be a number > 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    write(c.text);
    std::string warning;
    const Peak measured = peak(&warning);
    EXPECT_EQ(measured.flops, 100e9);
    EXPECT_EQ(measured.source, measured_source());
    EXPECT_NE(warning.find("warning: " + path()), std::string::npos) << warning;
    EXPECT_NE(warning.find(c.warning), std::string::npos) << warning;
    EXPECT_NE(warning.find("measuring the peak again"), std::string::npos) << warning;
    EXPECT_EQ(warning.find('\n'), std::string::npos);
    const PeakCache rewritten = read_peak_cache(path(), &warning);
    EXPECT_EQ(warning, "");
    EXPECT_EQ(rewritten.count(key), 1u);
  }
}

TEST_F(PeakCacheTest, TooManyEntriesOrAHugeFileAreRefused) {
  std::string text = "{";
  for (size_t i = 0; i <= kMaxPeakCacheEntries; ++i)
    text += absl::StrCat(i ? "," : "", "\"k", i, "\": {\"gflops\": 1}");
  write(text + "}");
  std::string warning;
  EXPECT_TRUE(read_peak_cache(path(), &warning).empty());
  EXPECT_NE(warning.find("entries, more than 64"), std::string::npos) << warning;
  write("{\"k\": {\"gflops\": 1}, \"pad\": \"" + std::string(kMaxPeakCacheBytes, 'x') + "\"}");
  EXPECT_TRUE(read_peak_cache(path(), &warning).empty());
  EXPECT_NE(warning.find("warning: " + path()), std::string::npos) << warning;
}

TEST_F(PeakCacheTest, ADirectoryInPlaceOfTheCacheIsAWarning) {
  fs::create_directories(path());
  std::string warning;
  EXPECT_EQ(peak(&warning).flops, 100e9);
  EXPECT_NE(warning.find("warning: " + path()), std::string::npos) << warning;
}

}  // namespace
}  // namespace switchyard
