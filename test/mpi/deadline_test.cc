// Deadlines inside the host backend (CallOptions::interrupt, runtime/mpi_wait.h).
//
// Late peer: the last rank enters each collective kLateS seconds after the others, whose
// interrupt reports a lost peer kFireS seconds into their call. They must return kPeerLost,
// naming the call and the interrupt's message, well within a second; a later call on the same
// backend must fail at once with kAborted naming that failure. The late rank then enters the
// same collective, so that MPI completes every abandoned request (checked through
// ReapAbandonedMpi) and the run ends cleanly. Each case runs on its own MPI_Comm_dup, so
// abandoned traffic never meets a later case.
//
// Never fires: with an interrupt that never fires, every call's result is bitwise the blocking
// path's, and both are the exact sums of collectives_test, rounded once to the dtype
// (Buf::Rounded: at P = 9, 7 * 45 = 315 is 316 in bfloat16). Element checks are EXPECTs and
// call statuses are agreed on across ranks (test/mpi/rank_checks.h): a failure on one rank
// never leaves the others waiting in a collective it skipped.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/arg_check.h"
#include "runtime/mpi_backend.h"
#include "runtime/mpi_wait.h"
#include "runtime/settings.h"
#include "runtime/shard.h"
#include "test/mpi/rank_checks.h"
#include "test/mpi/typed_buffer.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using Clock = std::chrono::steady_clock;
using testing::OneOddGroups;
using testing::World;
using Buf = testing::TypedBuffer;
using testing::AllEqual;
using testing::OkOnEveryRank;
using testing::OnEveryRank;

constexpr double kLateS = 1.5;   // how late the last rank enters
constexpr double kFireS = 0.2;   // when the others' interrupt fires, from their call's start
constexpr double kLimitS = 1.0;  // by when they must have returned
const char kLostMessage[] = "peer rank 4 stopped answering heartbeats (test)";

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Reports a lost peer from `seconds` after its construction on.
class FiresAfter : public Interrupt {
 public:
  explicit FiresAfter(double seconds) : start_(Clock::now()), seconds_(seconds) {}
  Status Check() const override {
    if (Since(start_) < seconds_) return Status::Ok();
    return PeerLostError(kLostMessage);
  }

 private:
  Clock::time_point start_;
  double seconds_;
};

class NeverFires : public Interrupt {
 public:
  Status Check() const override { return Status::Ok(); }
};

double F(size_t i) { return static_cast<double>(i % 7 + 1); }

// Buffers an abandoned call may still be written by MPI: kept until the process exits.
std::vector<std::unique_ptr<Buf>>& Kept() {
  static auto* kept = new std::vector<std::unique_ptr<Buf>>;
  return *kept;
}
Buf* Keep(DType dt, size_t n) {
  Kept().push_back(std::make_unique<Buf>(dt, n));
  return Kept().back().get();
}

enum class Call {
  kAllReduceMpi,  // the window off (POSEIDON_SHM_THRESHOLD_BYTES=0): MPI_Iallreduce
  kAllReduceShm,  // at or above it: the shared-memory collectives
  kReduceScatter,
  kAllGather,
  kAllGatherV,
  kBroadcast,
  kAgreement,    // agreed = false: the argument agreement's allreduce is the wait
  kRequestWait,  // IAllReduce, then Request::Wait(interrupt)
};

const char* CallName(Call c) {
  switch (c) {
    case Call::kAllReduceMpi:
      return "MpiBackend::AllReduce";
    case Call::kAllReduceShm:
      return "MpiBackend::AllReduce";
    case Call::kReduceScatter:
      return "MpiBackend::ReduceScatter";
    case Call::kAllGather:
      return "MpiBackend::AllGather";
    case Call::kAllGatherV:
      return "MpiBackend::AllGatherV";
    case Call::kBroadcast:
      return "MpiBackend::Broadcast";
    case Call::kAgreement:
      return "MpiBackend::AllReduce";
    case Call::kRequestWait:
      return "MpiBackend::IAllReduce";
  }
  return "";
}

std::string CaseName(const ::testing::TestParamInfo<Call>& info) {
  switch (info.param) {
    case Call::kAllReduceMpi:
      return "AllReduceMpi";
    case Call::kAllReduceShm:
      return "AllReduceShm";
    case Call::kReduceScatter:
      return "ReduceScatter";
    case Call::kAllGather:
      return "AllGather";
    case Call::kAllGatherV:
      return "AllGatherV";
    case Call::kBroadcast:
      return "Broadcast";
    case Call::kAgreement:
      return "Agreement";
    case Call::kRequestWait:
      return "RequestWait";
  }
  return "";
}

constexpr size_t kSmall = 1001;  // far below the shared-memory threshold

// Elements of a float32 allreduce that takes the shared-memory path.
size_t ShmCount() {
  return static_cast<size_t>(settings::ShmThresholdBytes()) / sizeof(float) + 1001;
}

// Runs `c` once on fresh buffers (kept alive for good: MPI may write them after an abandon).
Status RunCall(Call c, MpiBackend& be, const CallOptions& opts) {
  const int p = be.size(), me = be.rank();
  const DType dt = DType::kFloat32;
  switch (c) {
    case Call::kAllReduceMpi:
    case Call::kAgreement: {
      Buf* x = Keep(dt, kSmall);
      return be.AllReduce(x->data(), x->data(), kSmall, dt, opts);
    }
    case Call::kAllReduceShm: {
      size_t n = ShmCount();
      Buf* x = Keep(dt, n);
      for (size_t i = 0; i < n; ++i) x->Set(i, (me + 1) * F(i));
      return be.AllReduce(x->data(), x->data(), n, dt, opts);
    }
    case Call::kReduceScatter: {
      std::vector<size_t> counts = ShardCounts(kSmall, p);
      Buf* in = Keep(dt, kSmall);
      Buf* out = Keep(dt, counts[static_cast<size_t>(me)]);
      return be.ReduceScatter(in->data(), out->data(), counts, dt, opts);
    }
    case Call::kAllGather: {
      Buf* in = Keep(dt, kSmall);
      Buf* out = Keep(dt, kSmall * static_cast<size_t>(p));
      return be.AllGather(in->data(), out->data(), kSmall, dt, opts);
    }
    case Call::kAllGatherV: {
      std::vector<size_t> counts(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) counts[static_cast<size_t>(r)] = 3 * static_cast<size_t>(r) + 1;
      Buf* in = Keep(dt, counts[static_cast<size_t>(me)]);
      Buf* out = Keep(dt, SumCounts(counts));
      return be.AllGatherV(in->data(), out->data(), counts, dt, opts);
    }
    case Call::kBroadcast: {
      // From the late rank: a root's small broadcast may complete without its peers.
      Buf* x = Keep(dt, kSmall);
      return be.Broadcast(x->data(), kSmall, dt, p - 1, opts);
    }
    case Call::kRequestWait: {
      Buf* x = Keep(dt, kSmall);
      auto req = be.IAllReduce(x->data(), x->data(), kSmall, dt, opts);
      if (!req.ok()) return req.status();
      // The request dies abandoned at the end of this scope: its destructor must not block.
      return (*req)->Wait(opts.interrupt);
    }
  }
  return InternalError("RunCall: unknown case");
}

class LatePeer : public ::testing::TestWithParam<Call> {};

TEST_P(LatePeer, OthersGiveUpInTimeAndTheBackendStaysDown) {
  const Call c = GetParam();
  if (World()->size() < 2) GTEST_SKIP() << "needs a peer to wait for";
  if (c == Call::kAllReduceShm && settings::ShmThresholdBytes() <= 0) {
    GTEST_SKIP() << "POSEIDON_SHM_THRESHOLD_BYTES=0 disables the shared-memory path";
  }
  // The Open MPI cases run with the shared-memory window off (every call of a one-node
  // communicator would otherwise check its arguments there); the shared-memory case with a
  // threshold that makes its call pipelined (two steps, so the late rank meets the others'
  // absence at the second).
  ASSERT_TRUE(Settings::Global()
                  .Set("POSEIDON_SHM_THRESHOLD_BYTES", c == Call::kAllReduceShm ? "262144" : "0")
                  .ok());
  struct ResetSettings {
    ~ResetSettings() { Settings::Global().Reset(); }
  } reset_settings;
  MPI_Comm comm;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
  auto be = std::make_unique<MpiBackend>(comm);
  const bool late = be->rank() == be->size() - 1;
  NeverFires never;
  CallOptions opts;
  opts.agreed = c != Call::kAgreement;

  if (c == Call::kAllReduceShm) {
    // Every rank together first, so the window exists (its creation is collective).
    opts.interrupt = &never;
    Status warm = RunCall(c, *be, opts);
    ASSERT_TRUE(OkOnEveryRank(warm));
  }
  MPI_Barrier(comm);

  if (!late) {
    FiresAfter lost(kFireS);
    opts.interrupt = &lost;
    auto start = Clock::now();
    Status st = RunCall(c, *be, opts);
    double took = Since(start);
    RecordProperty("call_status", st.ToString());
    RecordProperty("call_seconds", std::to_string(took));
    EXPECT_EQ(st.code(), StatusCode::kPeerLost) << st.ToString();
    EXPECT_NE(st.message().find(StrCat(CallName(c), ": ")), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(kLostMessage), std::string::npos) << st.message();
    EXPECT_GE(took, kFireS * 0.9);
    EXPECT_LT(took, kLimitS) << "rank " << be->rank() << " returned after " << took << " s";

    // Every later call fails at once, naming the first failure; no MPI traffic is posted. (The
    // interrupt only keeps a broken build from hanging here.)
    FiresAfter bound(kLimitS);
    opts.interrupt = &bound;
    for (Call again : {Call::kAllReduceMpi, Call::kBroadcast, Call::kRequestWait}) {
      start = Clock::now();
      Status later = RunCall(again, *be, opts);
      if (again == Call::kAllReduceMpi) RecordProperty("later_status", later.ToString());
      EXPECT_LT(Since(start), 0.05);
      EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
      EXPECT_NE(later.message().find(CallName(again)), std::string::npos) << later.message();
      EXPECT_NE(later.message().find(StrCat("PeerLost: ", CallName(c), ": ", kLostMessage)),
                std::string::npos)
          << later.message();
    }
    EXPECT_EQ(be->Barrier().code(), StatusCode::kAborted);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
    if (c == Call::kAgreement) {
      // The others gave up inside the agreement: meet them there, not in the allreduce after it
      // (which they never posted).
      Status agreed = AgreeOnArgs(comm,
                                  {"AllReduce", static_cast<int64_t>(kSmall),
                                   static_cast<int64_t>(DType::kFloat32), -1, 0, Status()},
                                  MpiWait{&never, "late rank", nullptr});
      EXPECT_TRUE(agreed.ok()) << agreed.ToString();
    } else if (c == Call::kAllReduceShm) {
      // The others left after the first step: the late rank passes it, then waits for them at
      // the next one until its own interrupt fires.
      FiresAfter gone(0.3);
      opts.interrupt = &gone;
      Status st = RunCall(c, *be, opts);
      EXPECT_EQ(st.code(), StatusCode::kPeerLost) << st.ToString();
    } else {
      opts.interrupt = &never;  // the non-blocking form: MPI pairs it with the others' posts
      Status st = RunCall(c, *be, opts);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
  }

  // Everyone is past the collective now: MPI can finish every abandoned request.
  MPI_Barrier(MPI_COMM_WORLD);
  auto start = Clock::now();
  size_t pending = ReapAbandonedMpi();
  while (pending > 0 && Since(start) < 10.0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pending = ReapAbandonedMpi();
  }
  EXPECT_EQ(pending, 0u) << "abandoned requests MPI never completed";
  MPI_Barrier(MPI_COMM_WORLD);
  be.reset();  // collective when a shared-memory window exists
  MPI_Comm_free(&comm);
}

INSTANTIATE_TEST_SUITE_P(EveryWait, LatePeer,
                         ::testing::Values(Call::kAllReduceMpi, Call::kAllReduceShm,
                                           Call::kReduceScatter, Call::kAllGather,
                                           Call::kAllGatherV, Call::kBroadcast, Call::kAgreement,
                                           Call::kRequestWait),
                         CaseName);

// ---- An interrupt that never fires changes no bit. ----

const DType kAllTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                           DType::kBFloat16, DType::kInt32,   DType::kInt64};

class NeverFiring : public ::testing::TestWithParam<DType> {
 protected:
  Backend& be() { return World()->host_backend(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  double Tri() { return size() * (size() + 1) / 2.0; }
  static bool SameBytes(const Buf& a, const Buf& b) { return a.bytes == b.bytes; }
  // The exact value v (an integer sum) as the dtype holds it: what the collectives return.
  static double Exact(DType dt, double v) { return Buf::Rounded(dt, v); }
  NeverFires never;
  CallOptions Polled() {
    CallOptions o;
    o.interrupt = &never;
    return o;
  }
};

TEST_P(NeverFiring, AllReduceMatchesTheBlockingPathBitwise) {
  const DType dt = GetParam();
  // 300001 elements span several shared-memory chunks (POSEIDON_SHM_CHUNK_BYTES, 1 MiB).
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, ShmCount(), size_t{300001}}) {
    Buf send(dt, n), blocking(dt, n), polled(dt, n), in_place(dt, n);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    in_place.bytes = send.bytes;
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), blocking.data(), n, dt)));
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), polled.data(), n, dt, Polled())));
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(in_place.data(), in_place.data(), n, dt, Polled())));
    EXPECT_TRUE(SameBytes(blocking, polled)) << "n=" << n;
    EXPECT_TRUE(SameBytes(blocking, in_place)) << "n=" << n;
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return polled.Get(i); },
                         [&](size_t i) { return Exact(dt, Tri() * F(i)); }))
        << "n=" << n;
  }
}

TEST_P(NeverFiring, ReduceScatterAllGatherBroadcastMatchBitwise) {
  const DType dt = GetParam();
  const size_t p = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
  for (size_t n : {size_t{0}, size_t{7}, size_t{1001}, ShmCount()}) {
    std::vector<size_t> counts = ShardCounts(n, size());
    std::vector<size_t> off = PrefixOffsets(counts);
    Buf send(dt, n), rs_b(dt, counts[me]), rs_p(dt, counts[me]);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(be().ReduceScatter(send.data(), rs_b.data(), counts, dt)));
    ASSERT_TRUE(OkOnEveryRank(be().ReduceScatter(send.data(), rs_p.data(), counts, dt, Polled())));
    EXPECT_TRUE(SameBytes(rs_b, rs_p)) << "n=" << n;
    EXPECT_TRUE(AllEqual(counts[me], [&](size_t j) { return rs_p.Get(j); },
                         [&](size_t j) { return Exact(dt, Tri() * F(off[me] + j)); }))
        << "n=" << n;

    Buf ag_b(dt, n * p), ag_p(dt, n * p);
    ASSERT_TRUE(OkOnEveryRank(be().AllGather(send.data(), ag_b.data(), n, dt)));
    ASSERT_TRUE(OkOnEveryRank(be().AllGather(send.data(), ag_p.data(), n, dt, Polled())));
    EXPECT_TRUE(SameBytes(ag_b, ag_p)) << "n=" << n;
    EXPECT_TRUE(AllEqual(n * p, [&](size_t i) { return ag_p.Get(i); },
                         [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
        << "n=" << n;

    // Uneven: rank r sends counts[r] elements of its own.
    Buf mine(dt, counts[me]), agv_b(dt, n), agv_p(dt, n);
    for (size_t j = 0; j < counts[me]; ++j) mine.Set(j, (rank() + 1) * F(off[me] + j));
    ASSERT_TRUE(OkOnEveryRank(be().AllGatherV(mine.data(), agv_b.data(), counts, dt)));
    ASSERT_TRUE(OkOnEveryRank(be().AllGatherV(mine.data(), agv_p.data(), counts, dt, Polled())));
    EXPECT_TRUE(SameBytes(agv_b, agv_p)) << "n=" << n;
    for (size_t r = 0; r < p; ++r) {
      EXPECT_TRUE(AllEqual(counts[r], [&](size_t j) { return agv_p.Get(off[r] + j); },
                           [&](size_t j) { return Exact(dt, (r + 1) * F(off[r] + j)); }))
          << "n=" << n << ", from rank " << r;
    }

    const int root = size() - 1;
    Buf bc_b(dt, n), bc_p(dt, n);
    for (size_t i = 0; i < n; ++i) {
      bc_b.Set(i, rank() == root ? (root + 1) * F(i) : -1);
      bc_p.Set(i, rank() == root ? (root + 1) * F(i) : -1);
    }
    ASSERT_TRUE(OkOnEveryRank(be().Broadcast(bc_b.data(), n, dt, root)));
    ASSERT_TRUE(OkOnEveryRank(be().Broadcast(bc_p.data(), n, dt, root, Polled())));
    EXPECT_TRUE(SameBytes(bc_b, bc_p)) << "n=" << n;
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return bc_p.Get(i); },
                         [&](size_t i) { return Exact(dt, (root + 1) * F(i)); }))
        << "n=" << n;
  }
}

TEST_P(NeverFiring, RequestWaitMatchesPlainWait) {
  const DType dt = GetParam();
  const size_t n = 1001;
  Buf send(dt, n), plain(dt, n), polled(dt, n);
  for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
  auto a = be().IAllReduce(send.data(), plain.data(), n, dt);
  auto b = be().IAllReduce(send.data(), polled.data(), n, dt);
  ASSERT_TRUE(OkOnEveryRank(a.status()));
  ASSERT_TRUE(OkOnEveryRank(b.status()));
  ASSERT_TRUE(OkOnEveryRank((*a)->Wait()));
  ASSERT_TRUE(OkOnEveryRank((*b)->Wait(&never)));
  EXPECT_TRUE(SameBytes(plain, polled));
  EXPECT_TRUE(AllEqual(n, [&](size_t i) { return polled.Get(i); },
                       [&](size_t i) { return Exact(dt, Tri() * F(i)); }));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, NeverFiring, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return DTypeName(info.param); });

// The agreement's error path (every rank's values gathered) also runs under an interrupt.
TEST(PolledAgreement, MismatchStillNamesTheRanks) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  NeverFires never;
  CallOptions opts;
  opts.interrupt = &never;
  std::vector<float> buf(16, 1.0f);
  const int last = World()->size() - 1;
  size_t n = World()->rank() == last ? 12 : 10;
  Status st = World()->host_backend().AllReduce(buf.data(), buf.data(), n, DType::kFloat32, opts);
  ASSERT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find(
                StrCat("element count differs across ranks (", OneOddGroups(last, "10", "12"), ")")),
            std::string::npos)
      << st.message();
  // A disagreement abandons nothing: the backend still works.
  st = World()->host_backend().AllReduce(buf.data(), buf.data(), 4, DType::kFloat32, opts);
  ASSERT_TRUE(OkOnEveryRank(st));
  EXPECT_EQ(buf[0], static_cast<float>(World()->size()));
}

}  // namespace
}  // namespace poseidon
