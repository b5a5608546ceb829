// Runs only where a GPU is present; elsewhere it exits with the skip code so ctest
// reports it as skipped, never as passed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "engine/runtime/tensor.h"
#include "kernels/cuda/cuda_device.h"

namespace switchyard {
namespace {

TEST(CudaDevice, RoundTripsBytesAndAccountsMemory) {
  CudaDevice dev(0);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.5f * static_cast<float>(i) - 7.0f;
  {
    Tensor t = Tensor::empty({10, 100}, DType::kF32, MemoryKind::kActivations, dev);
    EXPECT_EQ(dev.memory_stats().current_bytes[static_cast<int>(MemoryKind::kActivations)], 4000);
    cuda_copy_to_device(dev, t.raw_data(), host.data(), t.nbytes());
    std::vector<float> back(host.size(), 0.0f);
    cuda_copy_to_host(dev, back.data(), t.slice_rows(0, 10).raw_data(), t.nbytes());
    EXPECT_EQ(back, host);
  }
  EXPECT_EQ(dev.memory_stats().current_bytes[static_cast<int>(MemoryKind::kActivations)], 0);
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
