// Multi-rank tests of node-shared memory (runtime/shm_regions.h) and the allreduce that sums
// straight between node-shared buffers (ShmCollectives::set_regions), directly and through
// MpiBackend::AllocShared. Exact values, every rank kept in step (rank_checks.h); part of
// shm_collectives_test.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/mpi_backend.h"
#include "runtime/settings.h"
#include "runtime/shm_collectives.h"
#include "runtime/shm_regions.h"
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
using testing::OkOnEveryRank;
using testing::OnEveryRank;
using testing::SameOnEveryRank;
using testing::World;

using Buf = testing::TypedBuffer;

class ShmShared : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto s = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0, 0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shm_ = std::move(s).value();
    auto r = SharedRegions::Create(World()->mpi_comm());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    regions_ = std::move(r).value();
    shm_->set_regions(regions_.get());
  }
  void TearDown() override {
    shm_.reset();
    regions_.reset();
  }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  double Tri() { return size() * (size() + 1) / 2.0; }
  // Collective: n elements of node-shared memory (at least one byte).
  unsigned char* Alloc(size_t bytes) {
    auto p = regions_->Allocate(bytes == 0 ? 1 : bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? static_cast<unsigned char*>(*p) : nullptr;
  }
  // Collective: a second window over the same regions whose gathers and broadcasts read their
  // peers with process_vm_readv from 1 byte (where the probe allows it); null on failure.
  std::unique_ptr<ShmCollectives> SingleCopyWindow() {
    auto c = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0, 1);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    std::unique_ptr<ShmCollectives> direct = std::move(c).value();
    direct->set_regions(regions_.get());
    return direct;
  }
  std::unique_ptr<ShmCollectives> shm_;
  std::unique_ptr<SharedRegions> regions_;
};

// Counts: one Sync's worth and below (the window's one-shot form), a few blocks with a ragged
// end, several MiB; float32 also 16 MiB + 4 B, where the outputs are written with streaming
// stores.
std::vector<size_t> SharedCounts(DType dt) {
  std::vector<size_t> n = {1, 7, 40000 + 3, (size_t{3} << 20) / DTypeSize(dt) + 5};
  if (dt == DType::kFloat32) n.push_back((size_t{16} << 20) / 4 + 1);
  return n;
}

// Values that round differently by rank (the same bits as the window is then a real check),
// integers for the integer types.
double Ragged(DType dt, int rank, size_t i) {
  const bool integral = dt == DType::kInt32 || dt == DType::kInt64;
  return (rank % 3 + 1) * 0.37 * F(i) + (integral ? 0 : 1.0 / (rank + 3));
}

TEST_P(ShmShared, AllReduceBetweenSharedBuffersIsExactOutOfPlaceAndInPlace) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  for (size_t n : SharedCounts(dt)) {
    Buf host(dt, n), got(dt, n);
    for (size_t i = 0; i < n; ++i) host.Set(i, (rank() + 1) * F(i));
    unsigned char* send = Alloc(n * es);
    unsigned char* recv = Alloc(n * es);
    ASSERT_TRUE(OnEveryRank(send != nullptr && recv != nullptr));
    std::memcpy(send, host.data(), n * es);
    std::memset(recv, 0xA5, n * es);
    const uint64_t before = shm_->shared_calls();
    auto want = [&](size_t i) { return Exact(dt, Tri() * F(i)); };
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send, recv, n, dt)));
    std::memcpy(got.data(), recv, n * es);
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return got.Get(i); }, want)) << "n=" << n;
    EXPECT_TRUE(SameOnEveryRank(recv, n * es)) << "n=" << n;
    // The input is untouched.
    EXPECT_EQ(std::memcmp(send, host.data(), n * es), 0) << "n=" << n;
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send, send, n, dt)));
    std::memcpy(got.data(), send, n * es);
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return got.Get(i); }, want)) << "in place, n=" << n;
    // Above the one-Sync size both calls summed straight between the shared buffers.
    const bool large = n * es > (size() <= 2 ? size_t{256} << 10 : size_t{32} << 10);
    EXPECT_EQ(shm_->shared_calls() - before, large ? 2u : 0u) << "n=" << n;
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(recv)));
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
  }
  EXPECT_EQ(regions_->live(), 0u);
}

// The same bits as the window: the shared way and the private way give identical outputs.
TEST_P(ShmShared, SameBitsAsTheWindow) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  const size_t n = 100003;
  Buf host(dt, n), window(dt, n);
  for (size_t i = 0; i < n; ++i) host.Set(i, Ragged(dt, rank(), i));
  ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(host.data(), window.data(), n, dt)));
  unsigned char* send = Alloc(n * es);
  unsigned char* recv = Alloc(n * es);
  std::memcpy(send, host.data(), n * es);
  ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(send, recv, n, dt)));
  EXPECT_TRUE(OnEveryRank(std::memcmp(recv, window.data(), n * es) == 0));
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(recv)));
}

// One rank's buffers are private (or only its input is shared): every rank takes the window,
// results exact.
TEST_P(ShmShared, PrivateBuffersOnOneRankTakeTheWindow) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  const size_t n = (size_t{1} << 20) / es + 3;
  for (int odd = 0; odd < 2; ++odd) {
    Buf host(dt, n), priv(dt, n), got(dt, n);
    for (size_t i = 0; i < n; ++i) host.Set(i, (rank() + 1) * F(i));
    unsigned char* send = Alloc(n * es);
    unsigned char* recv = Alloc(n * es);
    std::memcpy(send, host.data(), n * es);
    const bool alone = rank() == size() - 1;
    const void* in = alone && odd == 0 ? host.data() : send;
    void* out = alone ? priv.data() : recv;
    const uint64_t before = shm_->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(in, out, n, dt)));
    std::memcpy(got.data(), out, n * es);
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return got.Get(i); },
                         [&](size_t i) { return Exact(dt, Tri() * F(i)); }))
        << "odd=" << odd;
    EXPECT_EQ(shm_->shared_calls(), before);
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(recv)));
  }
}

// Reduce-scatter of more than one round from node-shared inputs (uneven shards, one of them
// empty where P > 2; outputs private or in place): exact, the same bits as the window, every
// call counted; a private input on one rank only: every rank takes the window.
TEST_P(ShmShared, ReduceScatterFromSharedInputs) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  const int p = size();
  std::vector<size_t> counts(static_cast<size_t>(p));
  size_t total = 0;
  for (int q = 0; q < p; ++q) {
    counts[static_cast<size_t>(q)] =
        p > 2 && q == 1 ? 0 : (size_t{700} << 10) / es + static_cast<size_t>(q) * 3 + 1;
    total += counts[static_cast<size_t>(q)];
  }
  size_t at = 0;
  for (int q = 0; q < rank(); ++q) at += counts[static_cast<size_t>(q)];
  const size_t mine = counts[static_cast<size_t>(rank())];
  Buf host(dt, total), window(dt, mine + 1), got(dt, mine + 1);
  for (size_t i = 0; i < total; ++i) host.Set(i, Ragged(dt, rank(), i));
  ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(host.data(), window.data(), counts, dt)));
  unsigned char* send = Alloc(total * es);
  std::memcpy(send, host.data(), total * es);
  for (int in_place = 0; in_place < 2; ++in_place) {
    if (in_place == 1) std::memcpy(send, host.data(), total * es);
    void* out = in_place == 1 ? static_cast<void*>(send + at * es) : got.data();
    const uint64_t before = shm_->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(send, out, counts, dt)));
    // More than one round (a round is at most 1 MiB, 512 KiB where ranks outnumber cores):
    // every call but one rank's own.
    EXPECT_EQ(shm_->shared_calls() - before, p > 1 ? 1u : 0u) << "in_place=" << in_place;
    EXPECT_TRUE(OnEveryRank(std::memcmp(out, window.data(), mine * es) == 0))
        << "in_place=" << in_place;
  }
  // Exact values: every rank's part summed (integers, so any order gives them).
  Buf ints(dt, total);
  for (size_t i = 0; i < total; ++i) ints.Set(i, (rank() + 1) * F(i));
  std::memcpy(send, ints.data(), total * es);
  ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(send, got.data(), counts, dt)));
  EXPECT_TRUE(AllEqual(mine, [&](size_t i) { return got.Get(i); },
                       [&](size_t i) { return Exact(dt, Tri() * F(at + i)); }));
  // One rank's input private: the window, the same bits.
  const uint64_t before = shm_->shared_calls();
  std::memcpy(send, host.data(), total * es);
  const void* in = rank() == p - 1 ? static_cast<const void*>(host.data()) : send;
  ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(in, got.data(), counts, dt)));
  EXPECT_TRUE(OnEveryRank(std::memcmp(got.data(), window.data(), mine * es) == 0));
  EXPECT_EQ(shm_->shared_calls(), before);
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
}

// Allgather and allgatherv of more than one round from node-shared inputs (outputs private, or
// the input in place in a shared output; one empty part where P > 2; float32 also past 16 MiB,
// where the copies stream): every part exact, every call counted; a private input on one rank
// only takes the window.
TEST_P(ShmShared, AllGatherFromSharedInputs) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  const int p = size();
  std::vector<size_t> sizes = {(size_t{300} << 10) / es + 3};
  if (dt == DType::kFloat32) sizes.push_back((size_t{16} << 20) / 4 / static_cast<size_t>(p) + 1);
  for (size_t n : sizes) {
    const size_t total = n * static_cast<size_t>(p);
    Buf host(dt, n), got(dt, total);
    for (size_t i = 0; i < n; ++i) host.Set(i, (rank() + 1) * F(i));
    auto check = [&](const void* out, const char* what) {
      Buf g(dt, total);
      std::memcpy(g.data(), out, total * es);
      EXPECT_TRUE(AllEqual(total, [&](size_t i) { return g.Get(i); },
                           [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
          << what << ", n=" << n;
    };
    unsigned char* send = Alloc(n * es);
    unsigned char* whole = Alloc(total * es);
    std::memcpy(send, host.data(), n * es);
    uint64_t before = shm_->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(send, got.data(), n, dt)));
    check(got.data(), "private output");
    std::memset(whole, 0xA5, total * es);
    unsigned char* mine = whole + static_cast<size_t>(rank()) * n * es;
    std::memcpy(mine, host.data(), n * es);
    ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(mine, whole, n, dt)));
    check(whole, "in place");
    EXPECT_EQ(shm_->shared_calls() - before, 2u) << "n=" << n;
    // One rank's input private: the window.
    before = shm_->shared_calls();
    const void* in = rank() == p - 1 ? static_cast<const void*>(host.data()) : send;
    ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(in, got.data(), n, dt)));
    check(got.data(), "one private input");
    EXPECT_EQ(shm_->shared_calls(), before);
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(whole)));
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
  }
  // Allgatherv: uneven parts, one of them empty where P > 2.
  std::vector<size_t> counts(static_cast<size_t>(p)), offsets(static_cast<size_t>(p));
  size_t total = 0;
  for (int q = 0; q < p; ++q) {
    offsets[static_cast<size_t>(q)] = total;
    counts[static_cast<size_t>(q)] =
        p > 2 && q == 1 ? 0 : (size_t{300} << 10) / es + static_cast<size_t>(q) * 5;
    total += counts[static_cast<size_t>(q)];
  }
  const size_t n = counts[static_cast<size_t>(rank())];
  Buf got(dt, total);
  unsigned char* send = Alloc(n * es);
  for (size_t i = 0; i < n; ++i) {
    Buf one(dt, 1);
    one.Set(0, (rank() + 1) * F(i));
    std::memcpy(send + i * es, one.data(), es);
  }
  const uint64_t before = shm_->shared_calls();
  ASSERT_TRUE(OkOnEveryRank(shm_->AllGatherV(n > 0 ? send : nullptr, got.data(), counts, dt)));
  EXPECT_EQ(shm_->shared_calls() - before, 1u);
  bool ok = true;
  for (int q = 0; q < p; ++q) {
    for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
      ok = ok && got.Get(offsets[static_cast<size_t>(q)] + i) == Exact(dt, (q + 1) * F(i));
    }
  }
  EXPECT_TRUE(OnEveryRank(ok));
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
}

// Where the gather would read its peers with process_vm_readv, node-shared inputs are read
// straight instead; a private input on one rank leaves the kernel's reads to every rank.
TEST_P(ShmShared, AllGatherFromSharedInputsBeforeTheKernelsReads) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  std::unique_ptr<ShmCollectives> direct = SingleCopyWindow();
  ASSERT_NE(direct, nullptr);
  const int p = size();
  const size_t n = (size_t{64} << 10) / es + 1;
  const size_t total = n * static_cast<size_t>(p);
  Buf host(dt, n), got(dt, total);
  for (size_t i = 0; i < n; ++i) host.Set(i, (rank() + 1) * F(i));
  unsigned char* send = Alloc(n * es);
  std::memcpy(send, host.data(), n * es);
  for (int odd = 0; odd < 2; ++odd) {
    const void* in = odd == 1 && rank() == p - 1 ? static_cast<const void*>(host.data()) : send;
    const uint64_t before = direct->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(direct->AllGather(in, got.data(), n, dt)));
    EXPECT_TRUE(AllEqual(total, [&](size_t i) { return got.Get(i); },
                         [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
        << "odd=" << odd;
    // Read straight only where the kernel's reads are on (the probe may turn them off).
    const bool on = direct->single_copy_bytes() > 0;
    EXPECT_EQ(direct->shared_calls() - before, on && odd == 0 ? 1u : 0u) << "odd=" << odd;
  }
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(send)));
}

// Broadcast of more than one piece from a node-shared root buffer: every receiver copies it
// straight (receivers' buffers private or shared), from every root, twice in a row from the same
// root and then another call; a private root buffer takes the window. Each call counted on
// every rank that took the straight way.
TEST_P(ShmShared, BroadcastFromASharedRootBuffer) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  const int p = size();
  std::vector<size_t> sizes = {(size_t{600} << 10) / es + 1, (size_t{5} << 20) / es + 3};
  if (dt == DType::kFloat32) sizes.push_back((size_t{16} << 20) / 4 + 1);
  for (size_t n : sizes) {
    // Where ranks outnumber cores, a broadcast of up to P slots goes across them instead.
    const bool straight = n * es > (size_t{512} << 10) && n * es > shm_->across_bytes();
    unsigned char* shared = Alloc(n * es);
    Buf priv(dt, n), want(dt, n), got(dt, n);
    for (int root = 0; root < p; ++root) {
      if (n * es > (size_t{8} << 20) && root != 0 && root != p - 1) continue;
      for (size_t i = 0; i < n; ++i) want.Set(i, (root + 1) * F(i));
      for (int rep = 0; rep < 2; ++rep) {
        // The root's buffer shared; a receiver's shared on even ranks, private on odd ones.
        const bool mine_shared = rank() == root || rank() % 2 == 0;
        unsigned char* buf = mine_shared ? shared : static_cast<unsigned char*>(priv.data());
        if (rank() == root) {
          std::memcpy(buf, want.data(), n * es);
        } else {
          std::memset(buf, 0xA5, n * es);
        }
        const uint64_t before = shm_->shared_calls();
        ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(buf, n, dt, root)));
        std::memcpy(got.data(), buf, n * es);
        EXPECT_TRUE(OnEveryRank(std::memcmp(got.data(), want.data(), n * es) == 0))
            << "n=" << n << " root=" << root << " rep=" << rep;
        EXPECT_EQ(shm_->shared_calls() - before, straight ? 1u : 0u)
            << "n=" << n << " root=" << root;
      }
      // Then another call, which settles the broadcast's agreement.
      Buf one(dt, 1), sum(dt, 1);
      one.Set(0, 1);
      ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(one.data(), sum.data(), 1, dt)));
      EXPECT_EQ(sum.Get(0), p);
    }
    // A private root buffer: the window.
    for (size_t i = 0; i < n; ++i) want.Set(i, 3 * F(i));
    if (rank() == 0) std::memcpy(priv.data(), want.data(), n * es);
    const uint64_t before = shm_->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(rank() == 0 ? priv.data() : shared, n, dt, 0)));
    EXPECT_TRUE(OnEveryRank(
        std::memcmp(rank() == 0 ? priv.data() : shared, want.data(), n * es) == 0));
    EXPECT_EQ(shm_->shared_calls(), before);
    ASSERT_TRUE(OkOnEveryRank(regions_->Free(shared)));
  }
}

// A receiver whose count differs from the root's: every rank fails the broadcast or (a receiver
// that matched the root and returned) its next call, naming the difference; then the window
// works again. Nobody waits for the failing rank's copy.
TEST(ShmSharedBroadcast, MismatchOnOneReceiverFailsEveryRank) {
  auto s = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0, 0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::unique_ptr<ShmCollectives> shm = std::move(s).value();
  auto r = SharedRegions::Create(World()->mpi_comm());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::unique_ptr<SharedRegions> regions = std::move(r).value();
  shm->set_regions(regions.get());
  const int me = World()->rank(), p = World()->size();
  if (p < 2) GTEST_SKIP() << "needs a receiver";
  const size_t n = (size_t{12} << 20) / 4;  // beyond a crowded window's slots at P <= 9
  auto got = regions->Allocate((n + 1) * 4);
  ASSERT_TRUE(OkOnEveryRank(got.status()));
  auto* buf = static_cast<float*>(*got);
  for (size_t i = 0; i <= n; ++i) buf[i] = me == 0 ? static_cast<float>(i) : -1.0f;
  Status b = shm->Broadcast(buf, me == p - 1 ? n + 1 : n, DType::kFloat32, 0);
  float x = 1, y = 0;
  Status next = shm->AllReduce(&x, &y, 1, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(!b.ok() || !next.ok())) << b.ToString() << " / " << next.ToString();
  const Status& failed = b.ok() ? next : b;
  EXPECT_NE(failed.ToString().find("Broadcast"), std::string::npos) << failed.ToString();
  ASSERT_TRUE(OkOnEveryRank(shm->AllReduce(&x, &y, 1, DType::kFloat32)));
  EXPECT_EQ(y, static_cast<float>(p));
  ASSERT_TRUE(OkOnEveryRank(shm->Broadcast(buf, n, DType::kFloat32, 0)));
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && buf[i] == static_cast<float>(i);
  EXPECT_TRUE(OnEveryRank(ok));
  shm.reset();
  ASSERT_TRUE(OkOnEveryRank(regions->Free(buf)));
}

// Where broadcasts read the root's buffer with process_vm_readv, a node-shared root buffer is
// copied straight instead.
TEST_P(ShmShared, BroadcastFromASharedRootBufferBeforeTheKernelsReads) {
  const DType dt = GetParam();
  const size_t es = DTypeSize(dt);
  std::unique_ptr<ShmCollectives> direct = SingleCopyWindow();
  ASSERT_NE(direct, nullptr);
  const size_t n = (size_t{2} << 20) / es + 1;
  unsigned char* shared = Alloc(n * es);
  Buf want(dt, n), priv(dt, n);
  for (size_t i = 0; i < n; ++i) want.Set(i, 7 * F(i));
  const int root = size() - 1;
  for (int odd = 0; odd < 2; ++odd) {
    // odd: the root's buffer private.
    unsigned char* buf = odd == 1 || rank() % 2 == 1 ? static_cast<unsigned char*>(priv.data())
                                                     : shared;
    if (rank() == root) {
      std::memcpy(buf, want.data(), n * es);
    } else {
      std::memset(buf, 0, n * es);
    }
    const uint64_t before = direct->shared_calls();
    ASSERT_TRUE(OkOnEveryRank(direct->Broadcast(buf, n, dt, root)));
    EXPECT_TRUE(OnEveryRank(std::memcmp(buf, want.data(), n * es) == 0)) << "odd=" << odd;
    const bool root_shared = odd == 0 && root % 2 == 0;
    const bool on = direct->single_copy_bcast_bytes() > 0 || n * es > direct->across_bytes();
    EXPECT_EQ(direct->shared_calls() - before, root_shared && on ? 1u : 0u)
        << "odd=" << odd;
  }
  ASSERT_TRUE(OkOnEveryRank(regions_->Free(shared)));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ShmShared, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return DTypeName(info.param);
                         });

TEST(ShmRegions, SizesMayDifferByRankAndBadSizesFailEveryRank) {
  auto r = SharedRegions::Create(World()->mpi_comm());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::unique_ptr<SharedRegions> regions = std::move(r).value();
  const int me = World()->rank(), p = World()->size();
  // Every rank writes its part; every rank sees every part through the codes.
  const size_t mine = 4096 * static_cast<size_t>(me + 1) + 8;
  auto got = regions->Allocate(mine);
  ASSERT_TRUE(OkOnEveryRank(got.status()));
  auto* base = static_cast<unsigned char*>(*got);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 64, 0u);
  std::memset(base, me + 1, mine);
  const uint64_t code = regions->Encode(base + 8, mine - 8);
  EXPECT_NE(code, 0u);
  EXPECT_EQ(regions->Encode(base + 8, mine), 0u);  // runs past the end of the part
  int other = 0;
  EXPECT_EQ(regions->Encode(&other, sizeof(other)), 0u);  // private memory
  std::vector<uint64_t> codes(static_cast<size_t>(p));
  MPI_Allgather(&code, 1, MPI_UINT64_T, codes.data(), 1, MPI_UINT64_T, World()->mpi_comm());
  bool seen = true;
  for (int q = 0; q < p; ++q) {
    const unsigned char* at = regions->Address(codes[static_cast<size_t>(q)], q);
    seen = seen && at != nullptr && at[0] == q + 1 && at[4096 * static_cast<size_t>(q)] == q + 1;
  }
  EXPECT_TRUE(OnEveryRank(seen));
  EXPECT_EQ(regions->Address(code + (uint64_t{1} << 40) * 5, me), nullptr);  // no such region
  EXPECT_EQ(regions->Address(0, me), nullptr);
  EXPECT_EQ(regions->Address(code, p), nullptr);  // no such rank
  MPI_Barrier(World()->mpi_comm());

  // A bad size on one rank fails the call on every rank, and nothing is allocated.
  auto bad = regions->Allocate(me == p - 1 ? 0 : 4096);
  EXPECT_TRUE(OnEveryRank(bad.status().code() == StatusCode::kInvalidArgument));
  if (me == p - 1) {
    EXPECT_NE(bad.status().message().find("bytes is 0"), std::string::npos) << bad.status().ToString();
  } else if (p > 1) {
    EXPECT_NE(bad.status().message().find("another rank"), std::string::npos)
        << bad.status().ToString();
  }
  EXPECT_EQ(regions->live(), 1u);
  // Freeing what is not a region's start is refused on this rank alone.
  Status wrong = regions->Free(base + 64);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument) << wrong.ToString();
  EXPECT_FALSE(regions->Owns(base + 64));
  EXPECT_TRUE(regions->Owns(base));
  ASSERT_TRUE(OkOnEveryRank(regions->Free(base)));
  EXPECT_EQ(regions->live(), 0u);
  EXPECT_EQ(regions->Free(base).code(), StatusCode::kInvalidArgument);  // twice
}

// A bad free on one rank fails every rank's free, and frees nothing: no rank is left in
// MPI_Win_free waiting for it.
TEST(ShmRegions, BadFreeOnOneRankFailsEveryRank) {
  auto r = SharedRegions::Create(World()->mpi_comm());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::unique_ptr<SharedRegions> regions = std::move(r).value();
  const int me = World()->rank(), p = World()->size();
  auto got = regions->Allocate(4096);
  ASSERT_TRUE(OkOnEveryRank(got.status()));
  auto* base = static_cast<unsigned char*>(*got);
  Status st = regions->Free(me == p - 1 ? base + 64 : base);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
  EXPECT_EQ(regions->live(), 1u);
  // NULL on every rank frees nothing; on one rank only it fails every rank.
  EXPECT_TRUE(OkOnEveryRank(regions->Free(nullptr)));
  if (p > 1) {
    st = regions->Free(me == 0 ? nullptr : base);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
    if (me == 0) {
      EXPECT_NE(st.message().find("NULL"), std::string::npos) << st.ToString();
    }
    EXPECT_EQ(regions->live(), 1u);
  }
  ASSERT_TRUE(OkOnEveryRank(regions->Free(base)));
  EXPECT_EQ(regions->live(), 0u);
}

// Through the backend: AllocShared / FreeShared, and an allreduce between such buffers exact
// at a size above every one-Sync form.
class ShmSharedBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", "1").ok());
  }
  void TearDown() override { Settings::Global().Reset(); }
  Backend& be() { return World()->host_backend(); }
};

TEST_F(ShmSharedBackend, AllocSharedAllReduceFreeShared) {
  const int me = World()->rank(), p = World()->size();
  const size_t n = 300007;
  const DType dt = DType::kFloat32;
  auto s = be().AllocShared(n * 4);
  ASSERT_TRUE(OkOnEveryRank(s.status()));
  auto r = be().AllocShared(n * 4);
  ASSERT_TRUE(OkOnEveryRank(r.status()));
  auto* send = static_cast<float*>(*s);
  auto* recv = static_cast<float*>(*r);
  for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>((me + 1) * F(i));
  const double tri = p * (p + 1) / 2.0;
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send, recv, n, dt)));
  EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(recv[i]); },
                       [&](size_t i) { return Exact(dt, tri * F(i)); }));
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(recv, recv, n, dt)));
  EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(recv[i]); },
                       [&](size_t i) { return Exact(dt, p * tri * F(i)); }));
  int local = 0;
  Status bogus = be().FreeShared(&local);
  EXPECT_EQ(bogus.code(), StatusCode::kInvalidArgument) << bogus.ToString();
  EXPECT_NE(bogus.message().find("FreeShared"), std::string::npos) << bogus.ToString();
  ASSERT_TRUE(OkOnEveryRank(be().FreeShared(recv)));
  ASSERT_TRUE(OkOnEveryRank(be().FreeShared(send)));
}

// With the window off there is no node-shared path: plain memory, freed the same way.
TEST_F(ShmSharedBackend, WindowOffGivesPlainMemory) {
  ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", "0").ok());
  const int p = World()->size();
  auto s = be().AllocShared(4096);
  ASSERT_TRUE(OkOnEveryRank(s.status()));
  auto* x = static_cast<float*>(*s);
  for (int i = 0; i < 1024; ++i) x[i] = static_cast<float>(i);
  ASSERT_TRUE(OkOnEveryRank(be().AllReduce(x, x, 1024, DType::kFloat32)));
  bool ok = true;
  for (int i = 0; i < 1024; ++i) ok = ok && x[i] == static_cast<float>(i * p);
  EXPECT_TRUE(OnEveryRank(ok));
  ASSERT_TRUE(OkOnEveryRank(be().FreeShared(x)));
  EXPECT_EQ(be().FreeShared(x).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace poseidon
