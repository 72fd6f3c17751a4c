// Checks for multi-rank GoogleTest bodies that keep every rank in step.
//
// A rank that leaves a test body early (a failed ASSERT) while its peers go on to the next
// collective leaves them waiting there until a timeout (60 s in the shared-memory collectives,
// for ever in MPI), and the one real failure drowns in timeouts. So:
//  - element checks use AllEqual with EXPECT_TRUE: the first mismatch and the number of
//    mismatches, once per check, and the test goes on (every rank makes the same calls);
//  - a collective's status uses ASSERT_TRUE(OkOnEveryRank(st)): collective, so every rank
//    stops at the same point when the call failed on any of them.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstddef>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon::testing {

// Collective over comm: success on every rank when `ok` holds on every rank, else a failure on
// every rank naming the ranks where it did not.
inline ::testing::AssertionResult OnEveryRank(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  int mine = ok ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(size), 0);
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (!all[static_cast<size_t>(r)]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (failed.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "failed on rank(s) " << failed;
}

// OnEveryRank(st.ok()), with this rank's status in the message when it is the failing one.
inline ::testing::AssertionResult OkOnEveryRank(const Status& st, MPI_Comm comm = MPI_COMM_WORLD) {
  ::testing::AssertionResult r = OnEveryRank(st.ok(), comm);
  if (!r && !st.ok()) r << "; here: " << st.ToString();
  return r;
}

// got(i) == want(i) for every i < n (doubles); on failure, how many differ and the first one.
template <typename Got, typename Want>
::testing::AssertionResult AllEqual(size_t n, Got got, Want want) {
  size_t wrong = 0, first = 0;
  double first_got = 0, first_want = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got(i), w = want(i);
    if (g == w) continue;
    if (wrong++ == 0) {
      first = i;
      first_got = g;
      first_want = w;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << std::setprecision(17) << wrong << " of " << n << " elements differ; the first, i=" << first
     << ": got " << first_got << ", expected " << first_want;
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace poseidon::testing
