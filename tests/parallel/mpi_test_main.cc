// GoogleTest main for multi-rank tests. Every rank runs every test; only rank 0 prints
// the usual report, the other ranks print just their failures, tagged with the rank.
// Every rank exits non-zero when any rank failed, so mpirun (and ctest) fails too.
#include <memory>

#include "engine/parallel/mpi_runtime.h"
#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"
#include "tests/parallel/rank_tests.h"

namespace switchyard::testing {
namespace {

std::unique_ptr<Communicator> g_world;

}  // namespace

Communicator& world() { return *g_world; }

}  // namespace switchyard::testing

int main(int argc, char** argv) {
  using switchyard::testing::g_world;
  switchyard::MpiRuntime& runtime = switchyard::MpiRuntime::initialize(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  g_world = runtime.world_communicator();
  const int status = switchyard::testing::run_tests_on_every_rank(*g_world);
  g_world.reset();
  return status;
}
