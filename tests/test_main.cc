// GoogleTest main for the single-process tests: OpenBLAS's fastest kernels for this CPU
// first (kernels/threads.h), so tests run at the speed the engine does.
#include <gtest/gtest.h>

#include "kernels/threads.h"

int main(int argc, char** argv) {
  switchyard::use_fastest_blas_kernels(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
