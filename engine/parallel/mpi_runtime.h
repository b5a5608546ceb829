// Process-wide MPI state: initialisation when launched by mpirun/srun, the job's
// shape (world and node), and ending the whole job from any one rank.
//
// A process started without a launcher never initialises MPI and runs as a world of
// one with LocalCommunicator, so `switchyard train` works without mpirun.
#pragma once

#include <memory>

#include "core/comm/communicator.h"

namespace switchyard {

class MpiRuntime {
 public:
  // Call once at the top of main, before any thread starts. Initialises MPI (asking
  // for MPI_THREAD_MULTIPLE, requiring MPI_THREAD_FUNNELED) when the process was
  // started by a launcher, detected by OMPI_COMM_WORLD_SIZE (mpirun), PMIX_RANK
  // (PMIx: OpenMPI, srun --mpi=pmix) or PMI_SIZE (srun PMI-2, Hydra). MPI is finalised
  // at exit. Later calls return the same runtime.
  static MpiRuntime& initialize(int* argc, char*** argv);
  // The runtime made by initialize(); CHECKs that it ran.
  static MpiRuntime& get();

  // Whether MPI is initialised (launched under mpirun/srun).
  bool launched() const { return launched_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // Rank among the processes of this node, and how many there are.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Compute threads (BLAS, OpenMP) for this process so that the node's ranks share its
  // cores instead of each starting one thread per core: the cores the node's ranks may
  // run on divided by the local ranks, at most the cores this rank is bound to, at
  // least 1.
  int threads_per_rank() const { return threads_per_rank_; }
  // Whether threads other than the main one may run collectives (MPI_THREAD_MULTIPLE),
  // each on a communicator of its own.
  bool threads_communicate() const { return threads_communicate_; }

  // The whole job: an MpiCommunicator over MPI_COMM_WORLD when launched, else a
  // LocalCommunicator.
  std::unique_ptr<Communicator> world_communicator() const;

 private:
  MpiRuntime() = default;

  bool launched_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int threads_per_rank_ = 1;
  bool threads_communicate_ = false;
};

// Ends every rank of the job with exit status `code` (MPI_Abort), so that an error on
// one rank never leaves the others waiting in a collective; without MPI it exits. Use it
// for any fatal error that other ranks may not see; an error every rank sees alike (a
// bad recipe) may return normally on every rank instead.
[[noreturn]] void abort_job(int code);

namespace internal {
[[noreturn]] void mpi_call_failed(const char* file, int line, const char* call, int error);
}  // namespace internal

}  // namespace switchyard

// Checks an MPI call's return code (the caller includes <mpi.h>); on failure prints file:line, the
// call and MPI's error string, then aborts the whole job. Communicators use MPI_ERRORS_RETURN so
// that errors reach this check instead of MPI's terse default handler.
#define SY_MPI_CHECK(call)                                                               \
  do {                                                                                   \
    const int sy_mpi_error_ = (call);                                                    \
    if (sy_mpi_error_ != MPI_SUCCESS) {                                                  \
      ::switchyard::internal::mpi_call_failed(__FILE__, __LINE__, #call, sy_mpi_error_); \
    }                                                                                    \
  } while (0)
