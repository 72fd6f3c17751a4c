// Multi-rank tests of the shared-memory collectives (runtime/shm_collectives.h), both called
// directly and through MpiBackend, and the argument agreement carried in the window.
// The backend, the error cases, ShmReduceSum and the agreement are in shm_backend_test.cc (the
// same test executable).
//
// Exact values two ways:
//  - formula: rank r contributes (r + 1) * F(i) with small integers F(i), so every sum is an
//    exact integer in the float32 accumulator; the expected value is that sum rounded once to
//    the dtype (Buf::Rounded: bfloat16 holds 8 significant bits, so at P = 9 45 * 7 = 315 is
//    316, and P * 49 = 343 at P = 7 is 344), and results compare with ==;
//  - rank order: rank r contributes an arbitrary (non-integer) value X(r, i) that any rank can
//    recompute, and the expected result is X(0, i) + X(1, i) + ... in that order (in float32
//    for the half types, rounded once), which is the summation order the algorithm promises.
// Every result is also compared byte for byte with rank 0's.
//
// Every rank makes the same calls whatever it finds: element checks are EXPECTs (AllEqual), and
// a call's status is agreed on (OkOnEveryRank), so a failure on one rank stops every rank at
// the same point instead of leaving the others in the next call until the 60 s timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/half.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"
#include "runtime/shard.h"
#include "runtime/shm_collectives.h"
#include "runtime/shm_reduce.h"
#include "test/mpi/rank_checks.h"
#include "test/mpi/shm_test_util.h"
#include "test/mpi/typed_buffer.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::AllEqual;
using testing::Exact;
using testing::F;
using testing::kAllTypes;
using testing::Layouts;
using testing::OkOnEveryRank;
using testing::OnEveryRank;
using testing::SameOnEveryRank;
using testing::World;

// A value with many significant bits, different per rank and index.
double X(int r, size_t i) {
  uint64_t h = (static_cast<uint64_t>(r) + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  h ^= h >> 31;
  return static_cast<double>(h % 2000001) / 1000.0 - 1000.0;  // in [-1000, 1000]
}

using Buf = testing::TypedBuffer;

// The guard bytes past the first n elements of b are untouched.
bool GuardKept(const Buf& b, size_t n) {
  for (size_t i = b.used(n); i < b.bytes.size(); ++i) {
    if (b.bytes[i] != Buf::kFill) return false;
  }
  return true;
}

// The value rank r stores for X(r, i) in this dtype, read back (what the reduction sees).
double Stored(DType dt, int r, size_t i) {
  double v = X(r, i);
  switch (dt) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat64: return v;
    case DType::kFloat16: return HalfToFloat(FloatToHalf(static_cast<float>(v)));
    case DType::kBFloat16: return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)));
    case DType::kInt32:
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(v * 1000));
  }
  return 0;
}

// Sum of X(0..P-1, i) in rank order, in the dtype's accumulator, stored back in the dtype.
void RankOrderSum(DType dt, int world, size_t i, Buf* out, size_t at) {
  switch (dt) {
    case DType::kFloat64: {
      double acc = 0;
      for (int r = 0; r < world; ++r) acc = r == 0 ? Stored(dt, r, i) : acc + Stored(dt, r, i);
      out->Set(at, acc);
      return;
    }
    case DType::kInt32:
    case DType::kInt64: {
      long long acc = 0;
      for (int r = 0; r < world; ++r) acc += static_cast<long long>(Stored(dt, r, i));
      out->Set(at, static_cast<double>(acc));
      return;
    }
    default: {  // float32, and the half types accumulated in float32 then rounded once
      float acc = 0;
      for (int r = 0; r < world; ++r) {
        float v = static_cast<float>(Stored(dt, r, i));
        acc = r == 0 ? v : acc + v;
      }
      out->Set(at, acc);  // Set rounds float32 -> the dtype once (exact for float32)
      return;
    }
  }
}

void FillX(Buf* b, int rank, size_t n) {
  bool integer = b->dtype == DType::kInt32 || b->dtype == DType::kInt64;
  for (size_t i = 0; i < n; ++i) b->Set(i, integer ? X(rank, i) * 1000 : X(rank, i));
}

struct Case {
  DType dtype;
  size_t chunk_bytes;
  size_t single_copy_bytes;  // Create's; 1: every gather, and every allreduce beyond one Sync
                             // and below 16 MiB, reads the peers directly
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return DTypeName(info.param.dtype) + "_chunk" + std::to_string(info.param.chunk_bytes) +
         (info.param.single_copy_bytes > 0 ? "_single_copy" : "");
}

// Both chunk sizes through the window, and the 1 MiB chunk with every allgather and allreduce
// that can read straight from the peers doing so (where this kernel allows it: ShmSingleCopy.ProbeTurnsItOnHere says).
std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType d : kAllTypes) {
    for (size_t c : {size_t{4096}, size_t{1} << 20}) cases.push_back({d, c, 0});
    cases.push_back({d, size_t{1} << 20, 1});
  }
  return cases;
}

// Element counts: empty, one, odd, a few chunks at 4 KiB, a few MiB (many chunks at 4 KiB).
std::vector<size_t> Counts(const Case& c) {
  std::vector<size_t> n = {0, 1, 7, 1001, 5 * 4096 + 3};
  // A few MiB; keep the tiny-chunk runs short (one Sync per 4 KiB).
  n.push_back(c.chunk_bytes >= (size_t{1} << 20) ? (size_t{3} << 20) / DTypeSize(c.dtype) + 5
                                                 : (size_t{1} << 18) + 1);
  return n;
}

class ShmDirect : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto s = ShmCollectives::Create(World()->mpi_comm(), GetParam().chunk_bytes, 60.0,
                                    GetParam().single_copy_bytes);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shm_ = std::move(s).value();
  }
  void TearDown() override { shm_.reset(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  double Tri() { return size() * (size() + 1) / 2.0; }
  std::unique_ptr<ShmCollectives> shm_;
};

TEST_P(ShmDirect, AllReduceFormulaOutOfPlaceAndInPlace) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    Buf send(dt, n), recv(dt, n);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    auto want = [&](size_t i) { return Exact(dt, Tri() * F(i)); };
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return recv.Get(i); }, want)) << "n=" << n;
    EXPECT_TRUE(GuardKept(recv, n)) << "n=" << n;
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send.data(), send.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return send.Get(i); }, want)) << "in place, n=" << n;
  }
}

TEST_P(ShmDirect, AllReduceRankOrderBitwise) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);  // the reference sum is computed on every rank
    Buf send(dt, n), recv(dt, n), want(dt, n);
    FillX(&send, rank(), n);
    for (size_t i = 0; i < n; ++i) RankOrderSum(dt, size(), i, &want, i);
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send.data(), recv.data(), n, dt)));
    EXPECT_EQ(std::memcmp(recv.data(), want.data(), recv.used(n)), 0) << "n=" << n;
    EXPECT_TRUE(SameOnEveryRank(recv.data(), recv.used(n))) << "n=" << n;
  }
}

TEST_P(ShmDirect, ReduceScatterUnevenShards) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);  // three layouts, each checked two ways
    for (const auto& counts : Layouts(size(), n)) {
      std::vector<size_t> off = PrefixOffsets(counts);
      size_t total = off.back(), mine = counts[static_cast<size_t>(rank())];
      size_t my_off = off[static_cast<size_t>(rank())];
      Buf send(dt, total), recv(dt, mine), want(dt, mine);
      for (size_t i = 0; i < total; ++i) send.Set(i, (rank() + 1) * F(i));
      ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(send.data(), recv.data(), counts, dt)));
      EXPECT_TRUE(AllEqual(mine, [&](size_t i) { return recv.Get(i); },
                           [&](size_t i) { return Exact(dt, Tri() * F(my_off + i)); }))
          << "n=" << n;
      EXPECT_TRUE(GuardKept(recv, mine)) << "n=" << n;
      FillX(&send, rank(), total);
      for (size_t i = 0; i < mine; ++i) RankOrderSum(dt, size(), my_off + i, &want, i);
      ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(send.data(), recv.data(), counts, dt)));
      EXPECT_EQ(std::memcmp(recv.data(), want.data(), recv.used(mine)), 0) << "n=" << n;
    }
  }
}

TEST_P(ShmDirect, AllGather) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);  // the output is P times larger
    size_t p = static_cast<size_t>(size());
    Buf send(dt, n), recv(dt, n * p);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n * p, [&](size_t i) { return recv.Get(i); },
                         [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
        << "n=" << n;
    EXPECT_TRUE(GuardKept(recv, n * p)) << "n=" << n;
    EXPECT_TRUE(SameOnEveryRank(recv.data(), recv.used(n * p))) << "n=" << n;
  }
}

// Calls of every kind and size back to back: the pipeline stages rotate across calls. Nothing
// else synchronizes the ranks between the calls (a fast rank runs into the next call's stages
// while slow ones still read the last), so the statuses are EXPECTs, not agreed on after each
// call; every rank makes every call, and a call that fails on one rank only breaks that rank's
// window, whose later calls fail at once (its peers time out once, not once per call).
TEST_P(ShmDirect, MixedSequenceKeepsStagesApart) {
  DType dt = GetParam().dtype;
  size_t p = static_cast<size_t>(size());
  for (int round = 0; round < 3; ++round) {
    for (size_t n : {size_t{3}, size_t{2049}, size_t{9000}, size_t{1}}) {
      SCOPED_TRACE("round " + std::to_string(round) + ", n=" + std::to_string(n));
      Buf a(dt, n), ar(dt, n), g(dt, n * p);
      for (size_t i = 0; i < n; ++i) a.Set(i, (rank() + 1) * F(i + round));
      Status st = shm_->AllReduce(a.data(), ar.data(), n, dt);
      EXPECT_TRUE(st.ok()) << st.ToString();
      st = shm_->AllGather(a.data(), g.data(), n, dt);
      EXPECT_TRUE(st.ok()) << st.ToString();
      std::vector<size_t> counts = ShardCounts(n * p, size());
      Buf rs(dt, counts[static_cast<size_t>(rank())]);
      st = shm_->ReduceScatter(g.data(), rs.data(), counts, dt);
      EXPECT_TRUE(st.ok()) << st.ToString();
      // Two broadcasts from different roots, each of several rounds at the 4 KiB chunk, between
      // the other calls: a root's slots rotate through the same stages as the others' do.
      const size_t bn = 3 * n + 1;
      for (int k = 0; k < 2; ++k) {
        const int root = (round + k) % size();
        Buf b(dt, bn);
        for (size_t i = 0; i < bn; ++i) b.Set(i, rank() == root ? (root + 2) * F(i + round) : -1);
        st = shm_->Broadcast(b.data(), bn, dt, root);
        EXPECT_TRUE(st.ok()) << st.ToString();
        EXPECT_TRUE(AllEqual(bn, [&](size_t i) { return b.Get(i); },
                             [&](size_t i) { return Exact(dt, (root + 2) * F(i + round)); }))
            << "root " << root;
      }
      EXPECT_TRUE(AllEqual(n, [&](size_t i) { return ar.Get(i); },
                           [&](size_t i) { return Exact(dt, Tri() * F(i + round)); }));
      EXPECT_TRUE(AllEqual(n * p, [&](size_t i) { return g.Get(i); },
                           [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n + round)); }));
      // Every rank gathered the same g, so the scatter is P times my slice of g: at P = 7 up to
      // 7 * 49 = 343, which bfloat16 rounds to 344.
      size_t off = ShardOffset(n * p, size(), rank());
      EXPECT_TRUE(AllEqual(counts[static_cast<size_t>(rank())], [&](size_t i) { return rs.Get(i); },
                           [&](size_t i) {
                             size_t j = off + i;
                             return Exact(dt, static_cast<double>(p) * (j / n + 1) * F(j % n + round));
                           }));
    }
  }
}

// AllGatherV and Broadcast directly: uneven counts (zeros, one rank holding everything) and a
// broadcast from every root, sizes from one element to several pipeline rounds.
TEST_P(ShmDirect, AllGatherVAndBroadcast) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);
    for (const auto& counts : Layouts(size(), n)) {
      std::vector<size_t> off = PrefixOffsets(counts);
      const size_t total = off.back(), mine = counts[static_cast<size_t>(rank())];
      Buf send(dt, mine), recv(dt, total);
      for (size_t j = 0; j < mine; ++j) {
        send.Set(j, (rank() + 1) * F(off[static_cast<size_t>(rank())] + j));
      }
      ASSERT_TRUE(OkOnEveryRank(shm_->AllGatherV(send.data(), recv.data(), counts, dt)));
      for (int r = 0; r < size(); ++r) {
        const size_t q = static_cast<size_t>(r);
        EXPECT_TRUE(AllEqual(counts[q], [&](size_t j) { return recv.Get(off[q] + j); },
                             [&](size_t j) { return Exact(dt, (r + 1) * F(off[q] + j)); }))
            << "n=" << n << ", from rank " << r;
      }
      EXPECT_TRUE(GuardKept(recv, total)) << "n=" << n;
    }
    for (int root = 0; root < size(); root += std::max(1, size() / 3)) {
      Buf b(dt, n);
      for (size_t i = 0; i < n; ++i) b.Set(i, rank() == root ? (root + 2) * F(i) : -1);
      ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(b.data(), n, dt, root)));
      EXPECT_TRUE(AllEqual(n, [&](size_t i) { return b.Get(i); },
                           [&](size_t i) { return Exact(dt, (root + 2) * F(i)); }))
          << "n=" << n << ", root " << root;
      EXPECT_TRUE(GuardKept(b, n)) << "n=" << n;
    }
  }
}


// The piecewise allreduce gives AllReduce's bits for the pieces' concatenation, in place, and a
// declined commit writes nothing but the first piece's sum.
TEST_P(ShmDirect, AllReducePiecesMatchesAllReduce) {
  DType dt = GetParam().dtype;
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);
    const size_t head = std::min<size_t>(n, 5);  // the committed first piece
    Buf whole(dt, n), want(dt, n), pieces_buf(dt, n);
    FillX(&whole, rank(), n);
    pieces_buf.bytes = whole.bytes;
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(whole.data(), want.data(), n, dt)));
    // Cut [head, n) into three uneven pieces, listed in order.
    const size_t es = DTypeSize(dt);
    unsigned char* base = static_cast<unsigned char*>(pieces_buf.data());
    std::vector<SumPiece> pieces;
    Buf head_sum(dt, head);
    pieces.push_back({base, head_sum.data(), head});
    const size_t cut1 = head + (n - head) / 3, cut2 = head + 2 * (n - head) / 3 + 1;
    size_t lo = head;
    for (size_t hi : {std::min(cut1, n), std::min(cut2, n), n}) {
      if (hi < lo) hi = lo;
      pieces.push_back({base + lo * es, base + lo * es, hi - lo});
      lo = hi;
    }
    const CollectiveArgs args{"AllReducePieces", static_cast<int64_t>(n),
                              static_cast<int64_t>(dt), -1, 0, Status::Ok()};
    for (bool accept : {false, true}) {
      bool committed = !accept;
      int calls = 0;
      SumCommit commit = [&](const void* sum) {
        ++calls;
        return accept && std::memcmp(sum, want.data(), head * es) == 0;
      };
      ASSERT_TRUE(OkOnEveryRank(
          shm_->AllReducePieces(pieces, dt, nullptr, args, commit, &committed)));
      EXPECT_EQ(committed, accept || n == 0) << "n=" << n;
      EXPECT_EQ(calls, n == 0 ? 0 : 1) << "n=" << n;
      EXPECT_EQ(std::memcmp(head_sum.data(), want.data(), head * es), 0) << "n=" << n;
      // Declined: the parts keep their inputs; accepted: they hold AllReduce's bits.
      const Buf& expect = accept ? want : whole;
      EXPECT_EQ(std::memcmp(base + head * es, static_cast<const unsigned char*>(expect.data()) +
                                                  head * es,
                            (n - head) * es),
                0)
          << "n=" << n << (accept ? " accepted" : " declined");
    }
    EXPECT_FALSE(shm_->broken());
  }
}

// Pieces with a sink: every element's sum reaches the sink exactly once, with AllReduce's bits,
// only after an accepted commit; pieces without one still get theirs in their outputs.
TEST_P(ShmDirect, AllReducePiecesSinksSeeEverySumOnce) {
  DType dt = GetParam().dtype;
  const size_t es = DTypeSize(dt);
  for (size_t n : Counts(GetParam())) {
    n = std::min(n, size_t{1} << 18);
    const size_t head = std::min<size_t>(n, 3);
    Buf whole(dt, n), want(dt, n), work(dt, n), sunk(dt, n), head_sum(dt, head);
    FillX(&whole, rank(), n);
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(whole.data(), want.data(), n, dt)));
    unsigned char* base = static_cast<unsigned char*>(work.data());
    unsigned char* out = static_cast<unsigned char*>(sunk.data());
    // [head, mid) through a sink, [mid, n) into its output, [n) nothing more.
    const size_t mid = head + (n - head) / 2;
    std::vector<int> seen(n, 0);
    const SumSink sink = [&](size_t offset, size_t count, const void* sum) {
      for (size_t i = 0; i < count; ++i) ++seen[head + offset + i];
      std::memcpy(out + (head + offset) * es, sum, count * es);
    };
    std::vector<SumPiece> pieces;
    pieces.push_back({base, head_sum.data(), head});
    pieces.push_back({base + head * es, base + head * es, mid - head, &sink});
    pieces.push_back({base + mid * es, base + mid * es, n - mid});
    const CollectiveArgs args{"AllReducePieces", static_cast<int64_t>(n),
                              static_cast<int64_t>(dt), -1, 0, Status::Ok()};
    for (bool accept : {false, true}) {
      std::memcpy(base, whole.data(), n * es);
      std::fill(seen.begin(), seen.end(), 0);
      bool committed = false;
      SumCommit commit = [&](const void*) { return accept; };
      ASSERT_TRUE(OkOnEveryRank(
          shm_->AllReducePieces(pieces, dt, nullptr, args, commit, &committed)));
      if (!accept && n > 0) {
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), static_cast<long>(n)) << "n=" << n;
        continue;
      }
      for (size_t i = head; i < mid; ++i) ASSERT_EQ(seen[i], 1) << "n=" << n << ", element " << i;
      EXPECT_EQ(std::memcmp(out + head * es,
                            static_cast<const unsigned char*>(want.data()) + head * es,
                            (mid - head) * es),
                0)
          << "n=" << n;
      EXPECT_EQ(std::memcmp(base + mid * es,
                            static_cast<const unsigned char*>(want.data()) + mid * es,
                            (n - mid) * es),
                0)
          << "n=" << n;
    }
    EXPECT_FALSE(shm_->broken());
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ShmDirect, ::testing::ValuesIn(AllCases()), CaseName);

}  // namespace
}  // namespace poseidon
