// GoogleTest main for multi-rank tests: MPI_Init, run, agree on the result, MPI_Finalize.
// Rank 0 prints the usual report; the other ranks print only their failures, each line tagged
// with the rank and the test. A failure on any rank fails the whole run (MPI_MAX of the results).
#include "test/mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace poseidon::testing {
namespace {
std::shared_ptr<Communicator> g_world;

// Ranks other than 0: the failed assertions, on stderr, named by rank and test.
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
}
std::shared_ptr<Communicator> World() { return g_world; }
}  // namespace poseidon::testing

int main(int argc, char** argv) {
  auto level = poseidon::InitMpi(&argc, &argv);
  if (!level.ok()) {
    std::fprintf(stderr, "%s\n", level.status().ToString().c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new poseidon::testing::FailurePrinter(rank));
  }
  auto world = poseidon::Communicator::Create(MPI_COMM_WORLD);
  if (!world.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, world.status().ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  poseidon::testing::g_world = *world;
  int result = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (result != 0) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  poseidon::testing::g_world.reset();
  MPI_Finalize();
  return any;
}
