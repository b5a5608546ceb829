// Runs only where a GPU is present; elsewhere it exits with the skip code so ctest
// reports it as skipped, never as passed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/runtime/tensor.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/devices.h"

namespace switchyard {
namespace {

TEST(CudaDevice, RoundTripsBytesAndAccountsMemory) {
  CudaDevice dev(0);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.5f * static_cast<float>(i) - 7.0f;
  {
    Tensor t = Tensor::empty({10, 100}, DType::kF32, MemoryKind::kActivations, dev);
    EXPECT_EQ(dev.memory_stats().current_bytes[static_cast<int>(MemoryKind::kActivations)], 4000);
    dev.copy_from_host(t.raw_data(), host.data(), t.nbytes());
    std::vector<float> back(host.size(), 0.0f);
    dev.copy_to_host(back.data(), t.slice_rows(0, 10).raw_data(), t.nbytes());
    EXPECT_EQ(back, host);
  }
  EXPECT_EQ(dev.memory_stats().current_bytes[static_cast<int>(MemoryKind::kActivations)], 0);
}

TEST(CudaDevice, TensorCopiesAndZeroingWorkAcrossDevices) {
  CudaDevice dev(0);
  Tensor host = Tensor::empty({4, 3});
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = static_cast<float>(i + 1);
  Tensor on_gpu = host.to(dev);
  EXPECT_EQ(&on_gpu.device(), &dev);
  EXPECT_EQ(&host.to(cpu_device()).device(), &cpu_device());
  // Device to device (rows 1..2 into a fresh tensor), then zero one row on the device.
  Tensor rows = Tensor::empty({2, 3}, DType::kF32, MemoryKind::kOther, dev);
  rows.copy_from(on_gpu.slice_rows(1, 3));
  Tensor zeroed = rows.slice_rows(0, 1);
  zeroed.zero_();
  const Tensor back = rows.on_host();
  const std::vector<float> expected = {0, 0, 0, 7, 8, 9};
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + 6), expected);
  // Tensor::zeros on the device.
  const Tensor z = Tensor::zeros({5}, DType::kF32, MemoryKind::kOther, dev).on_host();
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(z.data<float>()[i], 0.0f);
}

TEST(CudaDevice, RunsInBf16UnlessFp32IsAskedFor) {
  CudaDevice dev(0);
  EXPECT_EQ(working_dtype("", dev), DType::kBF16);
  EXPECT_EQ(working_dtype("bf16", dev), DType::kBF16);
  EXPECT_EQ(working_dtype("fp32", dev), DType::kF32);
}

// ctest hides the GPU from the tests not labelled gpu, so select_device's CUDA side is
// checked here.
TEST(CudaDevice, SelectDevicePicksTheGpuOfTheLocalRank) {
  std::string error;
  Device* automatic = select_device("", 0, &error);
  ASSERT_NE(automatic, nullptr) << error;
  EXPECT_TRUE(automatic->is_cuda());
  EXPECT_EQ(select_device("cuda", 0, &error), automatic);
  // Local ranks past the visible GPUs wrap around (a launcher may show each rank one).
  EXPECT_EQ(select_device("cuda", visible_gpus(), &error), automatic);
  EXPECT_GT(bf16_peak_flops(*automatic), 0.0);
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  if (switchyard::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
