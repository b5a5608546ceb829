// Shared by the tests/parallel binaries, whose main (mpi_test_main.cc) starts MPI when
// run under mpirun and otherwise runs them as a world of one.
#pragma once

#include <gtest/gtest.h>

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"
#include "tests/tensor_test_util.h"

namespace switchyard::testing {

// The job's world: an MpiCommunicator under mpirun, else a LocalCommunicator.
Communicator& world();

}  // namespace switchyard::testing
