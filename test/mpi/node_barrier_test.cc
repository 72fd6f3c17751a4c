// The OSU-style harness's node barrier (bench/osu/node_barrier.h): no rank leaves before the
// last one has entered, round after round with a different late rank each time; a rank that
// stops coming is named on every other rank once the deadline passes (never a hang), and the
// barrier is usable again once it comes.
#include "bench/osu/node_barrier.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace poseidon::osu {
namespace {

int Rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int Size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// The system-wide monotonic clock (every rank of a node reads the same one), in ns.
int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(NodeBarrier, NoRankLeavesBeforeTheLateOneEnters) {
  auto made = NodeBarrier::Create(MPI_COMM_WORLD, 60);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  NodeBarrier& barrier = **made;
  const int size = Size(), rank = Rank();
  int early = 0;  // rounds where this rank left before the late rank entered
  for (int round = 0; round < 12; ++round) {
    const int late = round % size;
    if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const int64_t entered = Now();
    Status st = barrier.Wait();
    const int64_t left = Now();
    EXPECT_TRUE(st.ok()) << st.ToString();
    int64_t late_entered = rank == late ? entered : 0;
    MPI_Allreduce(MPI_IN_PLACE, &late_entered, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    early += left < late_entered;
  }
  EXPECT_EQ(early, 0) << "rank " << rank << " left before the late rank entered";
}

TEST(NodeBarrier, MissingRankNamedAtTheDeadline) {
  const int size = Size(), rank = Rank();
  if (size < 2) GTEST_SKIP() << "needs a rank to go missing";
  // 2 s: long enough that no rank's ordinary wait below runs into it on a loaded machine.
  auto made = NodeBarrier::Create(MPI_COMM_WORLD, 2.0);
  ASSERT_TRUE(made.ok()) << made.status().ToString();  // alike on every rank (Create agrees)
  NodeBarrier& barrier = **made;
  Status st = barrier.Wait();
  EXPECT_TRUE(st.ok()) << st.ToString();
  const int missing = size - 1;
  if (rank != missing) {
    const int64_t start = Now();
    st = barrier.Wait();
    const double waited = static_cast<double>(Now() - start) * 1e-9;
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
    // The missing rank is named, last in the list (ranks ascending; a rank that is merely slow
    // may come before it).
    const std::string msg = st.message(), named = "for node rank(s) ", m = std::to_string(missing);
    const size_t at = msg.find(named);
    const size_t end = at == std::string::npos ? at : msg.find(';', at);
    const std::string list =
        end == std::string::npos ? "" : msg.substr(at + named.size(), end - at - named.size());
    const bool last = list == m || (list.size() > m.size() + 2 &&
                                    list.compare(list.size() - m.size() - 2, std::string::npos,
                                                 ", " + m) == 0);
    EXPECT_TRUE(last) << msg;
    EXPECT_GE(waited, 2.0);
    EXPECT_LT(waited, 20.0);
  }
  // The missing rank comes: its count catches up with the others', and every rank meets again.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == missing) {
    EXPECT_TRUE(barrier.Wait().ok());
  }
  EXPECT_TRUE(barrier.Wait().ok());
}

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
