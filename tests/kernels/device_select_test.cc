// Tensor copies through the Device interface, runtime.device and runtime.precision
// selection. The CUDA side of each is in tests/gpu/cuda_device_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "core/runtime/tensor.h"
#include "kernels/devices.h"

namespace switchyard {
namespace {

TEST(TensorCopies, ToTheSameDeviceSharesAndCopyFromMovesViews) {
  Tensor t = Tensor::empty({3, 2});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor same = t.on_host();
  EXPECT_EQ(same.raw_data(), t.raw_data());
  Tensor rows = Tensor::empty({2, 2});
  rows.copy_from(t.slice_rows(1, 3));
  EXPECT_EQ(rows.data<float>()[0], 2.0f);
  EXPECT_EQ(rows.data<float>()[3], 5.0f);
  Tensor middle = t.slice_rows(1, 2);
  middle.zero_();
  EXPECT_EQ(t.data<float>()[1], 1.0f);
  EXPECT_EQ(t.data<float>()[2], 0.0f);
  EXPECT_EQ(t.data<float>()[3], 0.0f);
  EXPECT_EQ(t.data<float>()[4], 4.0f);
}

TEST(SelectDevice, PicksTheCpuOrExplainsWhyNot) {
  std::string error;
  EXPECT_EQ(select_device("cpu", 0, &error), &cpu_device());
  Device* automatic = select_device("", 0, &error);
  ASSERT_NE(automatic, nullptr);
  EXPECT_EQ(automatic->is_cuda(), visible_gpus() > 0);

  EXPECT_EQ(select_device("tpu", 0, &error), nullptr);
  EXPECT_NE(error.find("runtime.device must be"), std::string::npos) << error;
  if (visible_gpus() == 0) {
    EXPECT_EQ(select_device("cuda", 0, &error), nullptr);
    EXPECT_NE(error.find(built_with_cuda() ? "no CUDA device is visible" : "no CUDA backend"),
              std::string::npos)
        << error;
  }
  EXPECT_EQ(bf16_peak_flops(cpu_device()), 0.0);
}

TEST(WorkingDtype, Fp32OnTheCpuUnlessBf16IsAskedFor) {
  EXPECT_EQ(working_dtype("", cpu_device()), DType::kF32);
  EXPECT_EQ(working_dtype("fp32", cpu_device()), DType::kF32);
  EXPECT_EQ(working_dtype("bf16", cpu_device()), DType::kBF16);
}

}  // namespace
}  // namespace switchyard
