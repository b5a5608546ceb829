// The runtime's view of the job: launched only under mpirun, one node's ranks sharing
// its cores for compute threads.
#include "engine/parallel/mpi_runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "core/comm/local_communicator.h"
#include "engine/parallel/mpi_communicator.h"
#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"

namespace switchyard {
namespace {

TEST(MpiRuntimeTest, PlainRunUsesTheLocalCommunicator) {
  const MpiRuntime& runtime = MpiRuntime::get();
  EXPECT_EQ(runtime.launched(), std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr);
  if (runtime.launched()) {
    EXPECT_NE(dynamic_cast<MpiCommunicator*>(&testing::world()), nullptr);
  } else {
    EXPECT_NE(dynamic_cast<LocalCommunicator*>(&testing::world()), nullptr);
  }
  EXPECT_EQ(runtime.world_size(), testing::world().size());
  EXPECT_EQ(runtime.world_rank(), testing::world().rank());
}

// ctest names the number of ranks it launched (SY_EXPECTED_WORLD_SIZE: 1, or mpirun's
// -np): ranks started as separate worlds of one, or a runtime that missed its launcher,
// fail here instead of passing every test as a world of one.
TEST(MpiRuntimeTest, WorldSizeIsTheNumberOfRanksLaunched) {
  const char* expected = std::getenv("SY_EXPECTED_WORLD_SIZE");
  if (expected == nullptr) GTEST_SKIP() << "SY_EXPECTED_WORLD_SIZE is set by ctest";
  EXPECT_EQ(MpiRuntime::get().world_size(), std::atoi(expected));
  EXPECT_EQ(testing::world().size(), std::atoi(expected));
}

TEST(MpiRuntimeTest, RanksOfOneNodeShareItsCores) {
  const MpiRuntime& runtime = MpiRuntime::get();
  // The tests run on one machine, so the node is the whole job.
  EXPECT_EQ(runtime.local_size(), runtime.world_size());
  EXPECT_GE(runtime.local_rank(), 0);
  EXPECT_LT(runtime.local_rank(), runtime.local_size());
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_GE(runtime.threads_per_rank(), 1);
  EXPECT_LE(static_cast<long>(runtime.threads_per_rank()) * runtime.local_size(),
            std::max<long>(cores, runtime.local_size()));
}

}  // namespace
}  // namespace switchyard
