// The main() of the GPU tests: the op table (tests/ops/op_table.h), which runs every op
// on the GPU and on the CPU from the same inputs and compares, and the tests of what is
// not an op comparison (the device, cuBLAS, NCCL, whole steps).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "kernels/cuda/cuda_device.h"
#include "tests/tensor_test_util.h"

namespace switchyard::testing {

// The body of every GPU test's main(): the skip code 77 where there is no GPU, so ctest
// reports the test as skipped, never as passed.
inline int run_gpu_tests(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace switchyard::testing
