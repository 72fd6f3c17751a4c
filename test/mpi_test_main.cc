// GoogleTest main for multi-rank tests: MPI_Init, run, agree on the result, MPI_Finalize.
// Output per rank: test/gtest_ranks.h. A failure on any rank fails the whole run (MPI_MAX of the
// results).
#include "test/mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "test/gtest_ranks.h"

namespace poseidon::testing {
namespace {
std::shared_ptr<Communicator> g_world;
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
  poseidon::testing::SetUpRankOutput(rank);
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
