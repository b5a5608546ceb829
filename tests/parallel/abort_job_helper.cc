// Run under mpirun by abort_job_test.sh: rank 1 hits a fatal error and calls abort_job
// while the other ranks wait in a barrier that rank 1 never reaches. Only the abort can
// end them; a correct abort_job makes mpirun exit non-zero at once.
#include <cstdio>
#include <memory>

#include "engine/parallel/mpi_runtime.h"

int main(int argc, char** argv) {
  switchyard::MpiRuntime& runtime = switchyard::MpiRuntime::initialize(&argc, &argv);
  std::unique_ptr<switchyard::Communicator> world = runtime.world_communicator();
  if (world->rank() == 1) {
    std::fprintf(stderr, "switchyard: rank 1: simulated fatal error\n");
    switchyard::abort_job(3);
  }
  world->barrier();
  std::printf("rank %d passed the barrier\n", world->rank());
  return 0;
}
