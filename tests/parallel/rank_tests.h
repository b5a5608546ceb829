// For GoogleTest mains that run every test on every rank of an MPI job.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/comm/communicator.h"

namespace switchyard::testing {

// Ranks other than 0 print just their failures, tagged with the rank (in place of
// GoogleTest's default printer).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestStart(const ::testing::TestInfo& info) override {
    test_name_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_name_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_name_;
};

// Runs every test on this rank: only rank 0 prints the usual report, the others their
// failures. Returns the exit status for every rank: non-zero when any rank failed, so
// mpirun (and ctest) fails too.
inline int run_tests_on_every_rank(Communicator& world) {
  const int rank = world.rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  int64_t failed_ranks = result == 0 ? 0 : 1;
  world.all_reduce_sum(&failed_ranks, 1);
  if (rank == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%lld of %d ranks had failures\n", static_cast<long long>(failed_ranks),
                 world.size());
  }
  return failed_ranks == 0 ? 0 : 1;
}

}  // namespace switchyard::testing
