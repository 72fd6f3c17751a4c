// The device backends' logic that needs no GPU (runtime/device_backend_logic.h): deadlines, the
// NCCL watchdog's no-progress rule, scratch growth and the ReduceScatter plan. Runs everywhere.
#include "runtime/device_backend_logic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/shard.h"

namespace poseidon {
namespace {

using device::Clock;
using device::Deadline;
using device::ProgressWatch;
using device::ReduceScatterPlan;
using std::chrono::milliseconds;
using Kind = ReduceScatterPlan::Kind;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

TEST(DeviceDeadline, ExpiresAtTheBoundAndNotBefore) {
  Deadline d(2.5, kT0);
  EXPECT_TRUE(d.enabled());
  EXPECT_EQ(d.seconds(), 2.5);
  EXPECT_FALSE(d.Expired(kT0));
  EXPECT_FALSE(d.Expired(kT0 + milliseconds(2499)));
  EXPECT_TRUE(d.Expired(kT0 + milliseconds(2500)));
  EXPECT_TRUE(d.Expired(kT0 + std::chrono::hours(2)));
  EXPECT_DOUBLE_EQ(d.RemainingS(kT0 + milliseconds(500)), 2.0);
  EXPECT_EQ(d.RemainingS(kT0 + milliseconds(3000)), 0.0);
}

TEST(DeviceDeadline, ZeroNegativeAndNonFiniteNeverExpire) {
  for (double s : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Deadline d(s, kT0);
    EXPECT_FALSE(d.enabled()) << s;
    EXPECT_EQ(d.seconds(), 0.0) << s;
    EXPECT_FALSE(d.Expired(kT0 + std::chrono::hours(1000))) << s;
    EXPECT_TRUE(std::isinf(d.RemainingS(kT0))) << s;
  }
  EXPECT_FALSE(Deadline().Expired());
}

TEST(DeviceDeadline, AfterCountsFromNow) {
  Deadline d = Deadline::After(3600);
  EXPECT_FALSE(d.Expired());
  EXPECT_GT(d.RemainingS(), 3590.0);
  EXPECT_TRUE(Deadline(0.001, Clock::now() - milliseconds(10)).Expired());
}

TEST(DeviceDeadline, ErrorNamesTheCallAndTheBound) {
  Status s = device::DeadlineError("NcclBackend: AllReduce", 2.5, ": a peer died");
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_EQ(s.message(),
            "NcclBackend: AllReduce did not finish within POSEIDON_PEER_TIMEOUT_S = 2.5 s: a "
            "peer died");
}

TEST(DeviceDeadline, InterruptFiresOnlyAfterTheDeadline) {
  device::DeadlineInterrupt never("MPI_Bcast(NCCL unique id)", Deadline(), "");
  EXPECT_TRUE(never.Check().ok());
  device::DeadlineInterrupt later("x", Deadline::After(3600), "");
  EXPECT_TRUE(later.Check().ok());
  device::DeadlineInterrupt past("MPI_Allgather(GPU check)",
                                 Deadline(0.5, Clock::now() - std::chrono::seconds(1)),
                                 ": a rank did not reach it");
  Status s = past.Check();
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_EQ(s.message(),
            "MPI_Allgather(GPU check) did not finish within POSEIDON_PEER_TIMEOUT_S = 0.5 s: a "
            "rank did not reach it");
}

TEST(DeviceBackoff, YieldsFirstThenSleepsBoundedly) {
  device::Backoff b;
  EXPECT_EQ(b.Next(Clock::now()).count(), 0);  // within the first 5 ms
  const auto later = Clock::now() + milliseconds(10);
  EXPECT_EQ(b.Next(later).count(), 8);
}

TEST(DeviceProgressWatch, IdleIsNeverOverdue) {
  ProgressWatch w(1.0);
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_FALSE(w.Overdue(kT0 + std::chrono::hours(5)));
  EXPECT_EQ(w.StalledS(kT0), 0.0);
}

TEST(DeviceProgressWatch, PendingWorkWithoutCompletionIsOverdueAtTheBound) {
  ProgressWatch w(1.0);
  w.Enqueued(kT0);
  EXPECT_FALSE(w.Overdue(kT0 + milliseconds(999)));
  EXPECT_TRUE(w.Overdue(kT0 + milliseconds(1000)));
  EXPECT_DOUBLE_EQ(w.StalledS(kT0 + milliseconds(1500)), 1.5);
}

TEST(DeviceProgressWatch, CompletionsRestartTheClock) {
  ProgressWatch w(1.0);
  w.Enqueued(kT0);
  w.Enqueued(kT0 + milliseconds(100));  // queued behind the first: no restart
  w.Enqueued(kT0 + milliseconds(200));
  EXPECT_EQ(w.pending(), 3u);
  w.Completed(1, kT0 + milliseconds(900));
  EXPECT_EQ(w.pending(), 2u);
  EXPECT_FALSE(w.Overdue(kT0 + milliseconds(1800)));
  EXPECT_TRUE(w.Overdue(kT0 + milliseconds(1900)));
  w.Completed(0, kT0 + milliseconds(1950));  // nothing completed: no progress
  EXPECT_TRUE(w.Overdue(kT0 + milliseconds(1950)));
  w.Completed(2, kT0 + milliseconds(2000));
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_FALSE(w.Overdue(kT0 + std::chrono::hours(1)));
  // A new operation after an idle period starts its own clock.
  w.Enqueued(kT0 + std::chrono::seconds(100));
  EXPECT_FALSE(w.Overdue(kT0 + std::chrono::seconds(100) + milliseconds(999)));
  EXPECT_TRUE(w.Overdue(kT0 + std::chrono::seconds(101)));
}

TEST(DeviceProgressWatch, ZeroTimeoutDisablesAndOvercountingClamps) {
  ProgressWatch off(0);
  off.Enqueued(kT0);
  EXPECT_FALSE(off.Overdue(kT0 + std::chrono::hours(100)));
  ProgressWatch w(1.0);
  w.Enqueued(kT0);
  w.Completed(5, kT0);
  EXPECT_EQ(w.pending(), 0u);
}

TEST(DeviceGrowCapacity, SteadyNeverGrowsAndGrowthDoublesInMiBSteps) {
  constexpr size_t kMiB = size_t{1} << 20;
  EXPECT_EQ(device::GrowCapacity(0, 0), 0u);
  EXPECT_EQ(device::GrowCapacity(0, 1), kMiB);
  EXPECT_EQ(device::GrowCapacity(0, kMiB + 1), 2 * kMiB);
  EXPECT_EQ(device::GrowCapacity(4 * kMiB, 4 * kMiB), 4 * kMiB);  // fits: unchanged
  EXPECT_EQ(device::GrowCapacity(4 * kMiB, 3 * kMiB), 4 * kMiB);
  EXPECT_EQ(device::GrowCapacity(4 * kMiB, 4 * kMiB + 1), 8 * kMiB);  // doubles
  EXPECT_EQ(device::GrowCapacity(4 * kMiB, 20 * kMiB + 5), 21 * kMiB);  // or what is needed
  // A size growing one byte per call reallocates O(log) times.
  size_t cap = 0, grows = 0;
  for (size_t need = 1; need <= 64 * kMiB; need += 4093) {
    size_t next = device::GrowCapacity(cap, need);
    ASSERT_GE(next, need);
    if (next != cap) ++grows;
    cap = next;
  }
  EXPECT_LE(grows, 8u);
  const size_t huge = std::numeric_limits<size_t>::max() - 3;
  EXPECT_GE(device::GrowCapacity(kMiB, huge), huge);  // no overflow
}

// Every plan must cover every element once, give each non-empty shard to its owner, and find
// this rank's slice where PrefixOffsets puts it.
void CheckPlan(const std::vector<size_t>& counts) {
  const std::vector<size_t> off = PrefixOffsets(counts);
  const size_t total = off.back();
  for (int rank = 0; rank < static_cast<int>(counts.size()); ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << counts.size());
    ReduceScatterPlan plan = device::PlanReduceScatter(counts, rank);
    EXPECT_EQ(plan.total, total);
    EXPECT_EQ(plan.mine, counts[static_cast<size_t>(rank)]);
    EXPECT_EQ(plan.mine_offset, off[static_cast<size_t>(rank)]);
    if (total == 0) {
      EXPECT_EQ(plan.kind, Kind::kNothing);
      continue;
    }
    bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    if (even) {
      EXPECT_EQ(plan.kind, Kind::kEven);
      EXPECT_EQ(plan.even, counts[0]);
      EXPECT_TRUE(plan.pieces.empty());
      continue;
    }
    ASSERT_EQ(plan.kind, Kind::kPerOwner);
    size_t covered = 0;
    int last_root = -1;
    for (const device::ReducePiece& p : plan.pieces) {
      EXPECT_GT(p.root, last_root);  // rank order, each owner once
      last_root = p.root;
      EXPECT_GT(p.count, 0u);
      EXPECT_EQ(p.count, counts[static_cast<size_t>(p.root)]);
      EXPECT_EQ(p.offset, off[static_cast<size_t>(p.root)]);
      covered += p.count;
    }
    EXPECT_EQ(covered, total);
    size_t nonempty = std::count_if(counts.begin(), counts.end(), [](size_t c) { return c > 0; });
    EXPECT_EQ(plan.pieces.size(), nonempty);
  }
}

TEST(DeviceReduceScatterPlan, EvenUnevenEmptyAndZeroShards) {
  CheckPlan({0});
  CheckPlan({5});
  CheckPlan({0, 0, 0});
  CheckPlan({4, 4, 4, 4});
  CheckPlan({3, 2});
  CheckPlan({0, 7, 0});
  CheckPlan({1, 0, 0, 0, 0});
  CheckPlan({9, 1, 4, 4, 0, 2, 7});
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{(1u << 18) + 3}}) {
      CheckPlan(ShardCounts(n, p));
    }
  }
}

TEST(DeviceReduceScatterPlan, PoseidonShardsSplitUnevenlyIntoOwnerReduces) {
  // 10 over 4 ranks: 3, 3, 2, 2.
  ReduceScatterPlan plan = device::PlanReduceScatter(ShardCounts(10, 4), 2);
  ASSERT_EQ(plan.kind, Kind::kPerOwner);
  ASSERT_EQ(plan.pieces.size(), 4u);
  EXPECT_EQ(plan.pieces[2].root, 2);
  EXPECT_EQ(plan.pieces[2].offset, 6u);
  EXPECT_EQ(plan.pieces[2].count, 2u);
  EXPECT_EQ(plan.mine, 2u);
  EXPECT_EQ(plan.mine_offset, 6u);
  // 2 over 4 ranks: the empty shards get no reduce.
  plan = device::PlanReduceScatter(ShardCounts(2, 4), 3);
  ASSERT_EQ(plan.kind, Kind::kPerOwner);
  ASSERT_EQ(plan.pieces.size(), 2u);
  EXPECT_EQ(plan.mine, 0u);
  EXPECT_EQ(plan.mine_offset, 2u);
}

}  // namespace
}  // namespace poseidon
