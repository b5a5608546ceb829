// Shared by the tests/parallel binaries, whose main (mpi_test_main.cc) starts MPI when
// run under mpirun and otherwise runs them as a world of one.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"

namespace switchyard::testing {

// The job's world: an MpiCommunicator under mpirun, else a LocalCommunicator.
Communicator& world();

// A CPU tensor holding `values`, and back.
template <typename T>
Tensor tensor_of(const std::vector<T>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

}  // namespace switchyard::testing
