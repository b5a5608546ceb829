// GoogleTest main for multi-rank tests. Every rank runs every test; only rank 0 prints
// the usual report, the other ranks print just their failures, tagged with the rank.
// Every rank exits non-zero when any rank failed, so mpirun (and ctest) fails too.
#include <cstdio>
#include <memory>
#include <string>

#include "engine/parallel/mpi_runtime.h"
#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"
#include "tests/parallel/rank_failure_printer.h"

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
  const int rank = g_world->rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new switchyard::testing::RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  int64_t failed_ranks = result == 0 ? 0 : 1;
  g_world->all_reduce_sum(&failed_ranks, 1);
  if (rank == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%lld of %d ranks had failures\n", static_cast<long long>(failed_ranks),
                 g_world->size());
  }
  g_world.reset();
  return failed_ranks == 0 ? 0 : 1;
}
