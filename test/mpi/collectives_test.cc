// Multi-rank tests of the MPI backend on host memory. Values come from an exact formula:
// rank r contributes (r + 1) * f(i) with small integers f(i), so every sum is an exact integer
// (in the float32 accumulator of the half types too); the expected value is that sum rounded
// once to the dtype (Buf::Rounded: at P = 9, 7 * 45 = 315 is 316 in bfloat16), and results
// compare with ==. Element checks are EXPECTs and call statuses are agreed on across ranks
// (test/mpi/rank_checks.h), so a failure on one rank never leaves the others in a collective.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "runtime/half.h"
#include "runtime/settings.h"
#include "runtime/shard.h"
#include "test/mpi/rank_checks.h"
#include "test/mpi/typed_buffer.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::AllEqual;
using testing::OkOnEveryRank;
using testing::OnEveryRank;
using testing::OneOddGroups;
using testing::World;

double F(size_t i) { return static_cast<double>(i % 7 + 1); }

using Buf = testing::TypedBuffer;

// The exact value v (an integer sum) as dtype dt holds it: what the collectives return.
double Exact(DType dt, double v) { return Buf::Rounded(dt, v); }

const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                           DType::kBFloat16, DType::kInt32,   DType::kInt64};
const size_t kCounts[] = {0, 1, 7, 1001, (1u << 20) + 3};  // up to a few MiB

class Collectives : public ::testing::TestWithParam<DType> {
 protected:
  Backend& be() { return World()->host_backend(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  double TriangleSum() { return size() * (size() + 1) / 2.0; }
};

TEST_P(Collectives, AllReduceOutOfPlaceAndInPlace) {
  DType dt = GetParam();
  for (size_t n : kCounts) {
    Buf send(dt, n), recv(dt, n);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    auto want = [&](size_t i) { return Exact(dt, TriangleSum() * F(i)); };
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return recv.Get(i); }, want)) << "n=" << n;
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), send.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return send.Get(i); }, want)) << "in place, n=" << n;
  }
}

TEST_P(Collectives, ReduceScatterUnevenShards) {
  DType dt = GetParam();
  for (size_t n : kCounts) {
    auto counts = ShardCounts(n, size());
    auto off = PrefixOffsets(counts);
    Buf send(dt, n), recv(dt, counts[rank()]);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(be().ReduceScatter(send.data(), recv.data(), counts, dt)));
    EXPECT_TRUE(AllEqual(counts[rank()], [&](size_t j) { return recv.Get(j); },
                         [&](size_t j) { return Exact(dt, TriangleSum() * F(off[rank()] + j)); }))
        << "n=" << n;
  }
  // An arbitrary layout with empty shards: rank r gets 3r elements.
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = 3 * r;
  auto off = PrefixOffsets(counts);
  Buf send(dt, off.back()), recv(dt, counts[rank()]);
  for (size_t i = 0; i < off.back(); ++i) send.Set(i, (rank() + 1) * F(i));
  ASSERT_TRUE(OkOnEveryRank(
      be().ReduceScatter(send.data(), counts[rank()] ? recv.data() : nullptr, counts, dt)));
  EXPECT_TRUE(AllEqual(counts[rank()], [&](size_t j) { return recv.Get(j); },
                       [&](size_t j) { return Exact(dt, TriangleSum() * F(off[rank()] + j)); }));
}

TEST_P(Collectives, AllGatherAndAllGatherV) {
  DType dt = GetParam();
  for (size_t n : {0ul, 1ul, 7ul, 1001ul}) {
    Buf send(dt, n), recv(dt, n * size());
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(be().AllGather(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n * size(), [&](size_t i) { return recv.Get(i); },
                         [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
        << "n=" << n;
  }
  // Rank r sends r elements (rank 0 sends none).
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = r;
  auto off = PrefixOffsets(counts);
  Buf send(dt, rank()), recv(dt, off.back());
  for (size_t i = 0; i < static_cast<size_t>(rank()); ++i) send.Set(i, (rank() + 1) * F(i));
  ASSERT_TRUE(OkOnEveryRank(be().AllGatherV(rank() ? send.data() : nullptr, recv.data(), counts, dt)));
  for (int r = 0; r < size(); ++r) {
    EXPECT_TRUE(AllEqual(counts[r], [&](size_t i) { return recv.Get(off[r] + i); },
                         [&](size_t i) { return Exact(dt, (r + 1) * F(i)); }))
        << "from rank " << r;
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  DType dt = GetParam();
  for (int root = 0; root < size(); ++root) {
    for (size_t n : {0ul, 1ul, 1001ul}) {
      Buf buf(dt, n);
      for (size_t i = 0; i < n; ++i) buf.Set(i, rank() == root ? (root + 1) * F(i) : -1);
      ASSERT_TRUE(OkOnEveryRank(be().Broadcast(buf.data(), n, dt, root)));
      EXPECT_TRUE(AllEqual(n, [&](size_t i) { return buf.Get(i); },
                           [&](size_t i) { return Exact(dt, (root + 1) * F(i)); }))
          << "root " << root << ", n=" << n;
    }
  }
}

// Two non-blocking allreduces in flight at once, one out of place and polled with Test, one in
// place and waited for.
TEST_P(Collectives, NonBlockingAllReduce) {
  DType dt = GetParam();
  size_t n = 1001;
  Buf a(dt, n), ar(dt, n), b(dt, n);
  for (size_t i = 0; i < n; ++i) {
    a.Set(i, (rank() + 1) * F(i));
    b.Set(i, (rank() + 1) * F(n - i));
  }
  auto r1 = be().IAllReduce(a.data(), ar.data(), n, dt);
  auto r2 = be().IAllReduce(b.data(), b.data(), n, dt);
  ASSERT_TRUE(OkOnEveryRank(r1.status()));
  ASSERT_TRUE(OkOnEveryRank(r2.status()));
  Status polled;
  for (;;) {
    auto t = (*r1)->Test();
    if (!t.ok()) {
      polled = t.status();
      break;
    }
    if (*t) break;
  }
  ASSERT_TRUE(OkOnEveryRank(polled));
  ASSERT_TRUE(OkOnEveryRank((*r2)->Wait()));
  EXPECT_TRUE(AllEqual(n, [&](size_t i) { return ar.Get(i); },
                       [&](size_t i) { return Exact(dt, TriangleSum() * F(i)); }));
  EXPECT_TRUE(AllEqual(n, [&](size_t i) { return b.Get(i); },
                       [&](size_t i) { return Exact(dt, TriangleSum() * F(n - i)); }));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, Collectives, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return DTypeName(info.param); });

// ---- Bad arguments: every rank must fail with the same clear error, and nobody hangs. ----

class BadArguments : public ::testing::Test {
 protected:
  Backend& be() { return World()->host_backend(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  std::vector<float> buf = std::vector<float>(64, 1.0f);
};

TEST_F(BadArguments, NullBufferOnOneRankFailsEveryRank) {
  int bad = size() - 1;
  void* recv = rank() == bad ? nullptr : buf.data();
  Status st = be().AllReduce(buf.data(), recv, 10, DType::kFloat32);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("recv buffer is null with count 10"), std::string::npos) << st.message();
  if (rank() != bad) {
    EXPECT_NE(st.message().find(StrCat("rank ", bad, " passed an invalid argument")),
              std::string::npos) << st.message();
  }
  // The communicator still works afterwards.
  ASSERT_TRUE(be().AllReduce(buf.data(), buf.data(), 4, DType::kFloat32).ok());
}

TEST_F(BadArguments, CountsThatDifferAcrossRanks) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  size_t n = rank() == size() - 1 ? 12 : 10;
  Status st = be().AllReduce(buf.data(), buf.data(), n, DType::kFloat32);
  ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
  EXPECT_NE(st.message().find("AllReduce: element count differs across ranks (" +
                              OneOddGroups(size() - 1, "10", "12") + ")"),
            std::string::npos) << st.message();
  st = be().AllGather(buf.data(), buf.data() + 32, rank() == 0 ? 1 : 2, DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kMismatch);
  DType dt = rank() == 0 ? DType::kFloat32 : DType::kInt32;
  st = be().AllReduce(buf.data(), buf.data(), 4, dt);
  EXPECT_EQ(st.code(), StatusCode::kMismatch);
  EXPECT_NE(st.message().find("dtype differs"), std::string::npos) << st.message();
  std::vector<size_t> counts = ShardCounts(10, size());
  if (rank() == 0) counts = ShardCounts(11, size());
  st = be().ReduceScatter(buf.data(), buf.data() + 32, counts, DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
}

TEST_F(BadArguments, UnknownDType) {
  Status st = be().AllReduce(buf.data(), buf.data(), 4, static_cast<DType>(17));
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("AllReduce: unknown dtype 17"), std::string::npos) << st.message();
}

TEST_F(BadArguments, RootOutsideRange) {
  for (int root : {-1, size()}) {
    Status st = be().Broadcast(buf.data(), 4, DType::kFloat32, root);
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(StrCat("Broadcast: root ", root, " is outside 0..", size() - 1)),
              std::string::npos) << st.message();
  }
  if (size() > 1) {  // roots that differ across ranks
    Status st = be().Broadcast(buf.data(), 4, DType::kFloat32, rank() == 0 ? 0 : 1);
    // A small broadcast on one node returns on its root and on the ranks that agree with it
    // before the others have checked it (here ranks 0 and 1 are both roots and every other
    // rank agrees with rank 1); the next call then fails on every rank with the mismatch.
    Status next = be().Barrier();
    Status seen = st.ok() ? next : st;
    EXPECT_EQ(seen.code(), StatusCode::kMismatch) << seen.ToString();
    EXPECT_NE(seen.message().find("root differs across ranks"), std::string::npos)
        << seen.message();
    if (st.ok()) {
      EXPECT_NE(next.message().find("Barrier: the previous collective on this communicator "
                                    "(Broadcast) returned here before its peers found"),
                std::string::npos)
          << next.message();
    }
    ASSERT_TRUE(be().AllReduce(buf.data(), buf.data(), 4, DType::kFloat32).ok());
  }
}

// AllReduce, AllGather and Broadcast take a straight path to the shared-memory window once it
// exists at the current settings (MpiBackend::Direct). A bad argument on one rank must still
// fail every rank with that rank's error there: each case runs after a good call of its kind.
TEST_F(BadArguments, EveryCheckHoldsOnTheStraightPath) {
  const bool me = rank() == 0;  // the one bad rank, and every broadcast's root
  float* p = buf.data();
  const size_t too_many = static_cast<size_t>(INT_MAX) + 1;
  CallOptions device;
  device.memory = MemoryKind::kDevice;
  const DType odd = static_cast<DType>(17);
  struct Case {
    const char* expect;
    std::function<Status()> good, bad;
  };
  auto all_reduce = [&](const void* s, void* r, size_t n, DType t, const CallOptions& o) {
    return be().AllReduce(s, r, n, t, o);
  };
  auto reduce = [&](bool bad_send, size_t n, DType t, const CallOptions& o) {
    return all_reduce(me && bad_send ? nullptr : p, p, me ? n : 4, me ? t : DType::kFloat32,
                      me ? o : CallOptions{});
  };
  // Allgather: 4 elements from each rank into p + 4.. (64 floats hold 9 ranks' 4 + 4 * 9).
  auto gather = [&](bool null_send, DType t) {
    return be().AllGather(me && null_send ? nullptr : p, p + 4, 4, me ? t : DType::kFloat32);
  };
  auto bcast = [&](void* b, int root, DType t, const CallOptions& o) {
    return be().Broadcast(me ? b : p, 4, me ? t : DType::kFloat32, me ? root : 0,
                          me ? o : CallOptions{});
  };
  const Case cases[] = {
      {"AllReduce: send buffer is null with count 4",
       [&] { return reduce(false, 4, DType::kFloat32, {}); },
       [&] { return reduce(true, 4, DType::kFloat32, {}); }},
      {"exceeds the MPI limit of 2^31-1 elements per call",
       [&] { return reduce(false, 4, DType::kFloat32, {}); },
       [&] { return reduce(false, too_many, DType::kFloat32, {}); }},
      {"AllReduce: unknown dtype 17", [&] { return reduce(false, 4, DType::kFloat32, {}); },
       [&] { return reduce(false, 4, odd, {}); }},
      {"backend was given device memory", [&] { return reduce(false, 4, DType::kFloat32, {}); },
       [&] { return reduce(false, 4, DType::kFloat32, device); }},
      {"AllGather: send buffer is null with count 4",
       [&] { return gather(false, DType::kFloat32); },
       [&] { return gather(true, DType::kFloat32); }},
      {"AllGather: unknown dtype 17", [&] { return gather(false, DType::kFloat32); },
       [&] { return gather(false, odd); }},
      {"Broadcast: buf buffer is null with count 4",
       [&] { return bcast(p, 0, DType::kFloat32, {}); },
       [&] { return bcast(nullptr, 0, DType::kFloat32, {}); }},
      {"Broadcast: root -1 is outside 0..", [&] { return bcast(p, 0, DType::kFloat32, {}); },
       [&] { return bcast(p, -1, DType::kFloat32, {}); }},
      {"Broadcast: unknown dtype 17", [&] { return bcast(p, 0, DType::kFloat32, {}); },
       [&] { return bcast(p, 0, odd, {}); }},
      {"Broadcast: the mpi backend was given device memory",
       [&] { return bcast(p, 0, DType::kFloat32, {}); },
       [&] { return bcast(p, 0, DType::kFloat32, device); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    ASSERT_TRUE(OkOnEveryRank(c.good()));
    Status st = c.bad();
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
    if (!me) {
      EXPECT_NE(st.message().find("rank 0 passed an invalid argument"), std::string::npos)
          << st.message();
    }
  }
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(p, p, 4, DType::kFloat32)));
}

// A root whose broadcast fails on its own arguments moves no data; its receivers still compare
// its slot's stamp with their own call before they learn the verdict. The root's next broadcast
// must not write into the slot they may still be reading: when it did (and the slot last held
// an allreduce's input, so the compare stopped at the first byte), a receiver's compare could
// see the old byte differ and then the new one equal, and return OK from the failed call. Each
// pair here runs as that: an allreduce, the failed broadcast, at once the root's next.
TEST_F(BadArguments, RootThatFailsItsBroadcastOverAndOver) {
  if (size() == 1) GTEST_SKIP() << "needs receivers";
  const bool root = rank() == 0;
  const float n = static_cast<float>(size());
  Status bad;
  for (int i = 0; i < 300; ++i) {
    SCOPED_TRACE(StrCat("pair ", i));
    for (int j = 0; j < 4; ++j) buf[j] = root ? static_cast<float>(i * 4 + j) : -1.0f;
    Status good = be().Broadcast(buf.data(), 4, DType::kFloat32, 0);
    ASSERT_TRUE(OnEveryRank(i == 0 || bad.code() == StatusCode::kInvalidArgument))
        << bad.ToString();
    ASSERT_TRUE(OkOnEveryRank(good));
    bool right = true;
    for (int j = 0; j < 4; ++j) right = right && buf[j] == static_cast<float>(i * 4 + j);
    ASSERT_TRUE(OnEveryRank(right)) << "values after the good broadcast";
    for (int j = 0; j < 4; ++j) buf[j] = 1.0f;
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(buf.data(), buf.data(), 4, DType::kFloat32)));
    ASSERT_TRUE(OnEveryRank(buf[0] == n && buf[3] == n)) << "values after the allreduce";
    bad = be().Broadcast(root ? nullptr : buf.data(), 4, DType::kFloat32, 0);
  }
  ASSERT_TRUE(OnEveryRank(bad.code() == StatusCode::kInvalidArgument)) << bad.ToString();
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(buf.data(), buf.data(), 4, DType::kFloat32)));
}

// Element counts whose product with the world size, or whose sum, wraps past 2^64 - 1 look
// small once wrapped: each must fail as the count it is, on every rank, before any data moves.
TEST_F(BadArguments, CountsThatWrapAround) {
  float* p = buf.data();
  const size_t half = (std::numeric_limits<size_t>::max() / 2) + 1;  // 2^63
  // AllGather: 2^63 elements from each rank, on every rank (wraps to 0 at two ranks).
  Status st = be().AllGather(p, p + 4, half, DType::kFloat32);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(size() == 1 ? StrCat("AllGather: count ", half, " exceeds")
                                          : StrCat("AllGather: count ", half, " from each of ",
                                                   size(), " ranks is more than 2^64-1")),
            std::string::npos)
      << st.message();
  ASSERT_TRUE(OkOnEveryRank(be().AllGather(p, p + 4, 4, DType::kFloat32)));
  // The same counts vector on every rank, whose sum wraps to size() - 1.
  std::vector<size_t> counts(static_cast<size_t>(size()), 1);
  counts[0] = std::numeric_limits<size_t>::max();
  if (size() > 1) {
    for (bool reduce : {true, false}) {
      st = reduce ? be().ReduceScatter(p, p + 32, counts, DType::kFloat32)
                  : be().AllGatherV(p, p + 32, counts, DType::kFloat32);
      ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      EXPECT_NE(st.message().find("counts add up to more than 2^64-1 elements"),
                std::string::npos)
          << st.message();
    }
  }
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(p, p, 4, DType::kFloat32)));
}

TEST_F(BadArguments, CountsVectorOfWrongLength) {
  std::vector<size_t> counts(size() + 1, 1);
  Status st = be().ReduceScatter(buf.data(), buf.data(), counts, DType::kFloat32);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(StrCat("counts has ", size() + 1, " entries; expected one per rank")),
            std::string::npos) << st.message();
}

TEST(Communicator, RanksAndHostKey) {
  auto w = World();
  int mpi_rank, mpi_size;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  EXPECT_EQ(w->rank(), mpi_rank);
  EXPECT_EQ(w->size(), mpi_size);
  EXPECT_EQ(w->local_size(), mpi_size);  // one host in tests
  EXPECT_EQ(w->local_rank(), mpi_rank);
  EXPECT_EQ(w->num_nodes(), 1);
  EXPECT_EQ(w->host_key().rfind(StrCat("P", mpi_size, "-hosts1-"), 0), 0u) << w->host_key();
  EXPECT_FALSE(w->backend(MemoryKind::kDevice).ok() && w->backend(MemoryKind::kDevice).value() == nullptr);
  // A communicator from a split: even and odd ranks.
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, mpi_rank % 2, mpi_rank, &half);
  {
    auto sub = Communicator::Create(half);
    ASSERT_TRUE(sub.ok());
    EXPECT_EQ((*sub)->size(), (mpi_size + 1 - mpi_rank % 2) / 2);
    float x = 1.0f;
    ASSERT_TRUE((*sub)->host_backend().AllReduce(&x, &x, 1, DType::kFloat32).ok());
    EXPECT_EQ(x, static_cast<float>((*sub)->size()));
  }
  MPI_Comm_free(&half);
  EXPECT_FALSE(Communicator::Create(MPI_COMM_NULL).ok());
}

}  // namespace
}  // namespace poseidon
