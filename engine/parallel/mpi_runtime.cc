#include "engine/parallel/mpi_runtime.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/comm/local_communicator.h"
#include "engine/parallel/mpi_communicator.h"

namespace switchyard {
namespace {

MpiRuntime* g_runtime = nullptr;

bool started_by_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr;
}

bool mpi_active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void finalize_mpi() {
  if (mpi_active()) MPI_Finalize();
}

cpu_set_t own_affinity() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  SY_CHECK_MSG(sched_getaffinity(0, sizeof(mask), &mask) == 0, "sched_getaffinity failed");
  return mask;
}

}  // namespace

namespace internal {
void mpi_call_failed(const char* file, int line, const char* call, int error) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(error, text, &length) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "MPI error code %d", error);
  }
  std::fprintf(stderr, "switchyard: rank %d: MPI error at %s:%d: %s: %s\n",
               g_runtime ? g_runtime->world_rank() : 0, file, line, call, text);
  abort_job(1);
}
}  // namespace internal

MpiRuntime& MpiRuntime::initialize(int* argc, char*** argv) {
  if (g_runtime) return *g_runtime;
  g_runtime = new MpiRuntime();
  MpiRuntime& runtime = *g_runtime;
  const cpu_set_t affinity = own_affinity();
  const int own_cores = CPU_COUNT(&affinity);
  if (!started_by_launcher()) {
    runtime.threads_per_rank_ = std::max(1, own_cores);
    return runtime;
  }

  // Multiple threads let gradient reductions run beside backward (on their own
  // communicators); with less, everything communicates from the main thread.
  int provided = 0;
  SY_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  std::atexit(finalize_mpi);
  SY_CHECK_MSG(provided >= MPI_THREAD_FUNNELED, "MPI lacks MPI_THREAD_FUNNELED support");
  runtime.threads_communicate_ = provided >= MPI_THREAD_MULTIPLE;
  // Communicators split from the world inherit this, so failures reach SY_MPI_CHECK.
  SY_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  runtime.launched_ = true;
  SY_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &runtime.world_rank_));
  SY_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &runtime.world_size_));

  MPI_Comm node;
  SY_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, runtime.world_rank_,
                                   MPI_INFO_NULL, &node));
  SY_MPI_CHECK(MPI_Comm_rank(node, &runtime.local_rank_));
  SY_MPI_CHECK(MPI_Comm_size(node, &runtime.local_size_));
  // The union of the node's affinity masks counts the cores the ranks share whether or
  // not the launcher bound each rank to its own cores.
  std::vector<cpu_set_t> masks(static_cast<size_t>(runtime.local_size_));
  SY_MPI_CHECK(MPI_Allgather(&affinity, sizeof(cpu_set_t), MPI_BYTE, masks.data(),
                             sizeof(cpu_set_t), MPI_BYTE, node));
  SY_MPI_CHECK(MPI_Comm_free(&node));
  cpu_set_t node_cores;
  CPU_ZERO(&node_cores);
  for (cpu_set_t& mask : masks) CPU_OR(&node_cores, &node_cores, &mask);
  runtime.threads_per_rank_ =
      std::max(1, std::min(own_cores, CPU_COUNT(&node_cores) / runtime.local_size_));
  return runtime;
}

MpiRuntime& MpiRuntime::get() {
  SY_CHECK_MSG(g_runtime != nullptr, "MpiRuntime::initialize was not called");
  return *g_runtime;
}

std::unique_ptr<Communicator> MpiRuntime::world_communicator() const {
  if (!launched_) return std::make_unique<LocalCommunicator>();
  return MpiCommunicator::duplicate(MPI_COMM_WORLD);
}

void abort_job(int code) {
  std::fflush(nullptr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  // MPI_Abort returned (it should not) or MPI is not running: end this process.
  std::_Exit(code);
}

}  // namespace switchyard
