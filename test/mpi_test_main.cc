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

std::string Ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  size_t i = 0;
  while (i < ranks.size()) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (i ? ", " : "") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string OneOddGroups(int odd, const std::string& value, const std::string& odd_value) {
  std::vector<int> rest;
  for (int r = 0; r < World()->size(); ++r) {
    if (r != odd) rest.push_back(r);
  }
  std::string odd_group = Ranks({odd}) + ": " + odd_value;
  std::string rest_group = Ranks(rest) + ": " + value;
  return odd == 0 ? odd_group + "; " + rest_group : rest_group + "; " + odd_group;
}
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
