// GoogleTest output under mpirun: rank 0 prints the usual report; every other rank prints
// only its failed assertions on stderr, each tagged with the rank and the test (silencing
// them altogether left "rank 3: tests failed" and nothing else). Used by every multi-rank
// test main (test/mpi_test_main.cc and the C API tests, which start MPI through psdInit).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace poseidon::testing {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // Remembered here: UnitTest::current_test_info() would take the lock that GoogleTest holds
  // while it reports a part result.
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_ = "?";
};

// Call after InitGoogleTest with this rank's MPI rank.
inline void SetUpRankOutput(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new FailurePrinter(rank));
}

}  // namespace poseidon::testing
