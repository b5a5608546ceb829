// For tests that run on every rank of an MPI job: ranks other than 0 print just their
// failures, tagged with the rank (install it in place of GoogleTest's default printer).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace switchyard::testing {

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

}  // namespace switchyard::testing
