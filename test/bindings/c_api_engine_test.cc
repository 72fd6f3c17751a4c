// The C API over the engine, across ranks (GoogleTest under mpirun, np 1 2 3), through the
// exported symbols of libposeidon.so only:
//  - a submission psdSubmit refuses on one rank (NULL handle pointer, bad layer id, NULL
//    gradient) fails every rank within seconds, not at the 300 s stall abort, and the peers'
//    message names that rank and the cause;
//  - psdWait with a timeout too large for a clock duration (LLONG_MAX ms, 1e10 s) waits for
//    ever instead of timing out at once, on a pending and on a completed handle;
//  - a re-plan (every rank stops and restarts its engine; the first rank to get there stops the
//    others' engines) leaves no sticky asynchronous error on any rank, and later exchanges work.
// Values follow the multi-rank tests' formula: rank r contributes (r + 1) f(i) with small
// integers f(i), so the float32 sum P (P + 1) / 2 f(i) is exact; the exchange averages it as
// sum * (1.0f / P), one float32 multiply (the engine's Scale), and the expectation computes
// exactly that, so results compare with == at any P (at P = 7 the product is not
// (P + 1) / 2 f(i) = 4 f(i) exactly: 1/7 is not a float).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "poseidon.h"  // includes mpi.h (C API only)
#include "test/gtest_ranks.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kCount = 1000;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::string Last(psdComm_t comm = nullptr) { return psdGetLastError(comm); }

float F(size_t i) { return static_cast<float>(i % 7 + 1); }

class CApiEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(psdCommInitWorld(&comm_), psdSuccess) << Last();
    ASSERT_EQ(psdCommRank(comm_, &rank_), psdSuccess);
    ASSERT_EQ(psdCommSize(comm_, &size_), psdSuccess);
  }
  void TearDown() override {
    if (comm_ != nullptr) EXPECT_EQ(psdCommDestroy(comm_), psdSuccess) << Last();
  }

  // Registers the dense layer "w" (kCount floats, allreduce) and plans.
  void RegisterAndPlan(psdComm_t comm) {
    psdLayerConfig_t cfg;
    ASSERT_EQ(psdLayerConfigInit(&cfg), psdSuccess);
    size_t shape[1] = {kCount};
    cfg.name = "w";
    cfg.ndim = 1;
    cfg.shape = shape;
    cfg.strategy = psdStrategyAllReduce;
    int id = -1;
    ASSERT_EQ(psdRegisterLayer(comm, &cfg, &id), psdSuccess) << Last(comm);
    ASSERT_EQ(id, 0);
    ASSERT_EQ(psdBuildPlan(comm, 1), psdSuccess) << Last(comm);
  }

  // This rank's gradient of layer 0.
  std::vector<float> Grad() const {
    std::vector<float> g(kCount);
    for (size_t i = 0; i < kCount; ++i) g[i] = static_cast<float>(rank_ + 1) * F(i);
    return g;
  }
  // The exchanged average of entry i, computed as the exchange computes it: the exact float32
  // sum over ranks, times the float32 1/P.
  float Expected(size_t i) const {
    const float sum = static_cast<float>(size_ * (size_ + 1) / 2) * F(i);  // exact
    return sum * (1.0f / static_cast<float>(size_));
  }
  // Counts the entries of an exchanged gradient that differ from the average.
  int Wrong(const std::vector<float>& g) const {
    int wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      if (g[i] != Expected(i)) ++wrong;
    }
    return wrong;
  }

  // One exchange of layer 0 on every rank, checked exactly.
  void Exchange(psdComm_t comm) {
    std::vector<float> g = Grad();
    psdHandle_t h = nullptr;
    ASSERT_EQ(psdSubmit(comm, 0, g.data(), nullptr, nullptr, nullptr, 0, &h), psdSuccess)
        << Last(comm);
    EXPECT_EQ(psdWait(h, 60000), psdSuccess) << Last(comm);
    EXPECT_EQ(Wrong(g), 0);
    EXPECT_EQ(psdHandleFree(h), psdSuccess);
  }

  static psdResult_t AsyncError(psdComm_t comm) {
    psdResult_t async = psdInternalError;
    EXPECT_EQ(psdCommGetAsyncError(comm, &async), psdSuccess) << Last(comm);
    return async;
  }
  // Polls the sticky asynchronous error until it is set or `seconds` passed.
  static psdResult_t AwaitAsyncError(psdComm_t comm, double seconds) {
    Clock::time_point t0 = Clock::now();
    psdResult_t async = AsyncError(comm);
    while (async == psdSuccess && SecondsSince(t0) < seconds) {
      SleepMs(5);
      async = AsyncError(comm);
    }
    return async;
  }

  psdComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

// The last rank alone makes a submission that psdSubmit refuses before the engine sees it; the
// other ranks submit the layer and wait. Every rank must fail within a few seconds (the stall
// abort would take 300 s; the peers' wait gives up after 30), the peers' message naming that
// rank and the cause, and a new plan must bring the exchange back.
TEST_F(CApiEngine, RefusedSubmissionOnOneRankFailsEveryRankFast) {
  struct Case {
    const char* what;
    const char* cause;  // in the message of every rank
  } cases[] = {
      {"NULL handle pointer", "handle is NULL"},
      {"layer id out of range", "layer id 7 is out of range"},
      {"negative layer id", "layer id -1 is out of range"},
      {"NULL gradient", "grad is null"},
  };
  const int bad = size_ - 1;
  const bool me = rank_ == bad;
  const std::string names_bad = "rank " + std::to_string(bad);
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); ++c) {
    SCOPED_TRACE(cases[c].what);
    // A communicator per case: the sticky error lasts for the communicator's life.
    psdComm_t comm = nullptr;
    ASSERT_EQ(psdCommInitWorld(&comm), psdSuccess) << Last();
    RegisterAndPlan(comm);
    Exchange(comm);  // the engine runs on every rank

    std::vector<float> g = Grad();
    psdHandle_t h = nullptr;
    Clock::time_point t0 = Clock::now();
    if (me) {
      psdResult_t r = psdInternalError;
      switch (c) {
        case 0:
          r = psdSubmit(comm, 0, g.data(), nullptr, nullptr, nullptr, 0, nullptr);
          break;
        case 1:
          r = psdSubmit(comm, 7, g.data(), nullptr, nullptr, nullptr, 0, &h);
          break;
        case 2:
          r = psdSubmit(comm, -1, g.data(), nullptr, nullptr, nullptr, 0, &h);
          break;
        default:
          r = psdSubmit(comm, 0, nullptr, nullptr, nullptr, nullptr, 0, &h);
          break;
      }
      EXPECT_EQ(r, psdInvalidArgument);
      EXPECT_EQ(h, nullptr);
      EXPECT_EQ(Last(comm).rfind("psdSubmit: ", 0), 0u) << Last(comm);
      EXPECT_NE(Last(comm).find(cases[c].cause), std::string::npos) << Last(comm);
    } else {
      ASSERT_EQ(psdSubmit(comm, 0, g.data(), nullptr, nullptr, nullptr, 0, &h), psdSuccess)
          << Last(comm);
      EXPECT_EQ(psdWait(h, 30000), psdInvalidArgument) << Last(comm);
      EXPECT_NE(Last(comm).find(names_bad), std::string::npos) << Last(comm);
      EXPECT_NE(Last(comm).find(cases[c].cause), std::string::npos) << Last(comm);
      EXPECT_EQ(psdHandleFree(h), psdSuccess);
    }
    // Every rank, the refusing one included, has the sticky error (on the refusing rank its
    // message is the last one: the others' last is their psdWait's).
    EXPECT_EQ(AwaitAsyncError(comm, 10), psdInvalidArgument);
    if (me) {
      EXPECT_NE(Last(comm).find("asynchronous error"), std::string::npos) << Last(comm);
      EXPECT_NE(Last(comm).find(names_bad), std::string::npos) << Last(comm);
      EXPECT_NE(Last(comm).find(cases[c].cause), std::string::npos) << Last(comm);
    }
    EXPECT_LT(SecondsSince(t0), 10.0) << "the failure took the stall abort's way";

    // A new plan starts a fresh engine; the exchange works again on every rank.
    ASSERT_EQ(psdBuildPlan(comm, 1), psdSuccess) << Last(comm);
    Exchange(comm);
    EXPECT_EQ(psdCommDestroy(comm), psdSuccess) << Last();
  }
}

// Timeouts beyond what a clock duration holds wait for ever: on a handle still pending (rank 0
// waits while the other ranks are 300 ms from submitting) and on a completed one. Before, the
// duration overflowed and psdWait returned psdTimeout at once.
TEST_F(CApiEngine, HugeTimeoutsWaitForEver) {
  RegisterAndPlan(comm_);
  const long long timeouts[] = {LLONG_MAX, 10'000'000'000'000LL /* 1e10 s */,
                                10'000'000'001LL /* just past 1e7 s */, -1};
  for (long long timeout_ms : timeouts) {
    SCOPED_TRACE("timeout_ms " + std::to_string(timeout_ms));
    if (rank_ != 0) SleepMs(300);
    std::vector<float> g = Grad();
    psdHandle_t h = nullptr;
    ASSERT_EQ(psdSubmit(comm_, 0, g.data(), nullptr, nullptr, nullptr, 0, &h), psdSuccess)
        << Last(comm_);
    Clock::time_point t0 = Clock::now();
    EXPECT_EQ(psdWait(h, timeout_ms), psdSuccess) << Last(comm_);
    if (rank_ == 0 && size_ > 1) {
      EXPECT_GT(SecondsSince(t0), 0.1) << "the handle was pending: the wait must have waited";
    }
    EXPECT_EQ(Wrong(g), 0);
    EXPECT_EQ(psdWait(h, timeout_ms), psdSuccess) << Last(comm_);  // completed: at once
    EXPECT_EQ(psdHandleFree(h), psdSuccess);
  }
  // An ordinary timeout still times out, and the handle stays valid.
  if (size_ > 1) {
    if (rank_ != 0) SleepMs(500);
    std::vector<float> g = Grad();
    psdHandle_t h = nullptr;
    ASSERT_EQ(psdSubmit(comm_, 0, g.data(), nullptr, nullptr, nullptr, 0, &h), psdSuccess)
        << Last(comm_);
    if (rank_ == 0) {
      EXPECT_EQ(psdWait(h, 50), psdTimeout) << Last(comm_);
      EXPECT_NE(Last(comm_).find("psdWait"), std::string::npos) << Last(comm_);
    }
    EXPECT_EQ(psdWait(h, LLONG_MAX), psdSuccess) << Last(comm_);
    EXPECT_EQ(Wrong(g), 0);
    EXPECT_EQ(psdHandleFree(h), psdSuccess);
  }
  EXPECT_EQ(AsyncError(comm_), psdSuccess) << Last(comm_);
}

// psdBuildPlan again, with the ranks arriving at different times: the first one's engine
// shutdown stops the others' engines while they still poll psdCommGetAsyncError. That clean,
// collective stop must set no sticky error on any rank, also when the exchanges of the step
// before it were detached (psdHandleFree before they completed); later exchanges succeed.
TEST_F(CApiEngine, ReplanLeavesNoStickyError) {
  RegisterAndPlan(comm_);
  Exchange(comm_);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<float> detached;  // borrowed by a detached exchange until the re-plan ends
    if (round == 2) {
      detached = Grad();
      psdHandle_t h = nullptr;
      ASSERT_EQ(psdSubmit(comm_, 0, detached.data(), nullptr, nullptr, nullptr, 0, &h), psdSuccess)
          << Last(comm_);
      EXPECT_EQ(psdHandleFree(h), psdSuccess);
    }
    const int first = round % size_;
    if (rank_ != first) {
      for (int i = 0; i < 30; ++i) {
        EXPECT_EQ(AsyncError(comm_), psdSuccess) << Last(comm_);
        SleepMs(10);
      }
    }
    ASSERT_EQ(psdBuildPlan(comm_, 1), psdSuccess) << Last(comm_);
    EXPECT_EQ(AsyncError(comm_), psdSuccess) << Last(comm_);
    Exchange(comm_);
    Exchange(comm_);
    EXPECT_EQ(AsyncError(comm_), psdSuccess) << Last(comm_);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (psdInit() != psdSuccess) {
    std::fprintf(stderr, "psdInit: %s\n", psdGetLastError(nullptr));
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  poseidon::testing::SetUpRankOutput(rank);
  int result = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (psdFinalize() != psdSuccess) return 1;
  return any;
}
