// Multi-rank tests of the shared-memory collectives through MpiBackend (the shared-memory path
// forced on), their error cases, ShmReduceSum, and the argument agreement carried in the window.
// Exact values and rank checks as in shm_collectives_test.cc (the same test executable).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
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
using testing::SameStatusOnEveryRank;
using testing::World;

using Buf = testing::TypedBuffer;

// Through the backend with the shared-memory path forced on: what every strategy will call.
class ShmBackend : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", "1").ok());
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_CHUNK_BYTES", "8192").ok());
  }
  void TearDown() override { Settings::Global().Reset(); }
  Backend& be() { return World()->host_backend(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
};

TEST_P(ShmBackend, AllReduceReduceScatterAllGatherExact) {
  DType dt = GetParam();
  double tri = size() * (size() + 1) / 2.0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{3 * 8192 + 1}, size_t{100003}}) {
    Buf send(dt, n), recv(dt, n);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return recv.Get(i); },
                         [&](size_t i) { return Exact(dt, tri * F(i)); }))
        << "n=" << n;
    EXPECT_TRUE(SameOnEveryRank(recv.data(), recv.used(n))) << "n=" << n;

    for (const auto& counts : Layouts(size(), n)) {
      std::vector<size_t> off = PrefixOffsets(counts);
      size_t mine = counts[static_cast<size_t>(rank())];
      size_t my_off = off[static_cast<size_t>(rank())];
      Buf all(dt, off.back()), part(dt, mine);
      for (size_t i = 0; i < off.back(); ++i) all.Set(i, (rank() + 1) * F(i));
      ASSERT_TRUE(OkOnEveryRank(
          be().ReduceScatter(all.data(), mine ? part.data() : nullptr, counts, dt)));
      EXPECT_TRUE(AllEqual(mine, [&](size_t i) { return part.Get(i); },
                           [&](size_t i) { return Exact(dt, tri * F(my_off + i)); }))
          << "n=" << n;
    }

    Buf gathered(dt, n * static_cast<size_t>(size()));
    ASSERT_TRUE(OkOnEveryRank(be().AllGather(send.data(), gathered.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n * static_cast<size_t>(size()), [&](size_t i) { return gathered.Get(i); },
                         [&](size_t i) { return Exact(dt, (i / n + 1) * F(i % n)); }))
        << "n=" << n;
  }
}

// The chunk setting may change between calls: the window is rebuilt, results stay exact.
TEST_P(ShmBackend, ChunkChangeRebuildsWindow) {
  DType dt = GetParam();
  double tri = size() * (size() + 1) / 2.0;
  const size_t n = 20001;
  for (const char* chunk : {"4096", "65536", "4096"}) {
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_CHUNK_BYTES", chunk).ok());
    Buf send(dt, n), recv(dt, n);
    for (size_t i = 0; i < n; ++i) send.Set(i, (rank() + 1) * F(i));
    ASSERT_TRUE(OkOnEveryRank(be().AllReduce(send.data(), recv.data(), n, dt)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return recv.Get(i); },
                         [&](size_t i) { return Exact(dt, tri * F(i)); }))
        << "chunk=" << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ShmBackend, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return DTypeName(info.param);
                         });

TEST(ShmErrors, ChunkTooSmallFailsOnEveryRank) {
  auto s = ShmCollectives::Create(World()->mpi_comm(), 100, 10.0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("POSEIDON_SHM_CHUNK_BYTES is 100"), std::string::npos)
      << s.status().message();
}

// Create's outcome when one rank (odd) passed `theirs` for `name` and the others `usual`.
void ExpectSettingMismatch(const Result<std::unique_ptr<ShmCollectives>>& s, const char* name,
                           int odd, const char* usual, const char* theirs) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kMismatch);
  EXPECT_NE(s.status().message().find(std::string(name) + " differs across ranks (" +
                                      testing::OneOddGroups(odd, usual, theirs) + ")"),
            std::string::npos)
      << s.status().message();
}

TEST(ShmErrors, ChunkMismatchFailsOnEveryRank) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto s = ShmCollectives::Create(World()->mpi_comm(), World()->rank() == 0 ? 8192 : 4096, 10.0);
  ExpectSettingMismatch(s, "POSEIDON_SHM_CHUNK_BYTES", 0, "4096", "8192");
}

// A rank that never joins: the others fail with kTimeout naming it, instead of hanging, and
// later calls on their window fail fast with kAborted.
TEST(ShmErrors, MissingPeerTimesOutAndNamesIt) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto created = ShmCollectives::Create(World()->mpi_comm(), 4096, 0.3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto shm = std::move(created).value();
  std::vector<float> x(4096, 1.0f);
  if (World()->rank() != 0) {
    Status st = shm->AllReduce(x.data(), x.data(), x.size(), DType::kFloat32);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
    EXPECT_NE(st.message().find("for node ranks 0"), std::string::npos) << st.message();
    Status again = shm->AllGather(x.data(), x.data(), 1, DType::kFloat32);
    EXPECT_EQ(again.code(), StatusCode::kAborted) << again.ToString();
  }
  MPI_Barrier(World()->mpi_comm());
  shm.reset();  // collective: every rank frees the window together
}

// A rank that frees its window while its peers wait for it in a collective (it skipped the
// call and destroyed its communicator): they fail at once with kAborted naming it, long before
// their timeout (60 s here, which would give kTimeout), and later calls fail fast too.
TEST(ShmErrors, PeerThatLeavesFailsItsWaitersAtOnce) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto created = ShmCollectives::Create(World()->mpi_comm(), 4096, 60.0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto shm = std::move(created).value();
  std::vector<float> x(4096, 1.0f);
  const int last = World()->size() - 1;
  // A first call every rank makes, so that the leaver has arrivals behind it.
  ASSERT_TRUE(OkOnEveryRank(shm->AllReduce(x.data(), x.data(), 16, DType::kFloat32)));
  if (World()->rank() == last) {
    shm.reset();  // blocks in MPI_Win_free until the others free theirs
    return;
  }
  Status st = shm->AllReduce(x.data(), x.data(), x.size(), DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find(StrCat("node rank ", last, " left")), std::string::npos)
      << st.message();
  Status again = shm->Broadcast(x.data(), 1, DType::kFloat32, 0);
  EXPECT_EQ(again.code(), StatusCode::kAborted) << again.ToString();
  shm.reset();
}

TEST(ShmErrors, SingleCopyMismatchFailsOnEveryRank) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto s = ShmCollectives::Create(World()->mpi_comm(), 8192, 10.0,
                                  World()->rank() == 1 ? 65536 : 32768);
  ExpectSettingMismatch(s, "POSEIDON_SHM_SINGLE_COPY_BYTES", 1, "32768", "65536");
}

// The single-copy allgather (runtime/shm_collectives.h, "Single copy").
class ShmSingleCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
    auto s = ShmCollectives::Create(World()->mpi_comm(), 8192, 60.0, 1);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shm_ = std::move(s).value();
    if (shm_->single_copy_bytes() == 0) {
      GTEST_SKIP() << "this kernel refuses the single-copy path: " << shm_->single_copy_note();
    }
  }
  void TearDown() override { shm_.reset(); }
  // `pages` fresh pages of this rank's memory, whose protection a test may change (munmap
  // them at the end).
  float* MapPages(size_t pages) {
    void* map = mmap(nullptr, pages * PageBytes(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return map == MAP_FAILED ? nullptr : static_cast<float*>(map);
  }
  static size_t PageBytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  // After a failed call: the window is still in step (a small allreduce, exact everywhere).
  void ExpectInStep() {
    std::vector<float> x(9, 1.0f), y(9);
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(x.data(), y.data(), 9, DType::kFloat32)));
    EXPECT_TRUE(OnEveryRank(y[8] == static_cast<float>(World()->size())));
  }
  std::unique_ptr<ShmCollectives> shm_;
};

// Ranks of one job under one user may read each other's memory on Linux unless ptrace rules
// or seccomp forbid it: the probe must not turn the path off for no reason. Every rank reaches
// the same verdict.
TEST_F(ShmSingleCopy, ProbeTurnsItOnEverywhere) {
  EXPECT_EQ(shm_->single_copy_requested(), 1u);
  EXPECT_TRUE(OnEveryRank(shm_->single_copy_bytes() == 1u));
  EXPECT_TRUE(shm_->single_copy_note().empty()) << shm_->single_copy_note();
}

// One rank's input lies in memory it cannot be read from (an unmapped page, as after a buffer
// freed too early): every rank fails the call with the same error naming that rank, nothing
// crashes, and the next call works. The rank gathers in place, so it never touches the page
// itself.
TEST_F(ShmSingleCopy, UnreadableInputOnOneRankFailsEveryRankAlike) {
  const int p = World()->size(), me = World()->rank(), bad = p - 1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t n = page / sizeof(float);
  void* map = mmap(nullptr, page * static_cast<size_t>(p), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  float* recv = static_cast<float*>(map);
  float* mine = recv + static_cast<size_t>(me) * n;
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(me + 1);
  if (me == bad) {
    ASSERT_EQ(munmap(mine, page), 0);
  }
  Status st = shm_->AllGather(mine, recv, n, DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kBackendError) << st.ToString();
  EXPECT_NE(st.message().find(StrCat("could not read node rank ", bad, "'s buffer")),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(SameStatusOnEveryRank(st)) << st.ToString();
  // The window is still in step: a good gather works.
  std::vector<float> send(16, static_cast<float>(me + 1)), all(16 * static_cast<size_t>(p));
  ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(send.data(), all.data(), 16, DType::kFloat32)));
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<float>(i / 16 + 1));
  munmap(map, page * static_cast<size_t>(p));  // the unmapped page, if any, is skipped
}

// The single-copy allreduce: one rank's input can be read by that rank but not by its peers
// (every page but those of its own shard made inaccessible), so each peer fails to read it and
// the rank itself fails to write the peers' sums into those pages. Every rank returns the same
// error, naming that rank, nothing crashes, and the next call works. The buffer is one chunk,
// larger than the one-Sync size, and each shard starts on a page.
TEST_F(ShmSingleCopy, UnreadableInputOnOneRankFailsEveryAllReduceAlike) {
  const int p = World()->size(), me = World()->rank(), bad = p - 1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t shard_bytes = p <= 4 ? (size_t{256} << 10) : (size_t{64} << 10);
  ASSERT_EQ(shard_bytes % page, 0u);
  const size_t bytes = shard_bytes * static_cast<size_t>(p), n = bytes / sizeof(float);
  ASSERT_GE(shm_->single_copy_reduce_bytes(), 1u);
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  float* buf = static_cast<float*>(map);
  unsigned char* base = static_cast<unsigned char*>(map);
  for (int r = 0; r < p; ++r) {
    ASSERT_EQ(ShardOffset(n, p, r) * sizeof(float), static_cast<size_t>(r) * shard_bytes);
    if (me == bad && r != me) {
      // Not unmapped: the rank's own allocations could then land in the hole.
      ASSERT_EQ(mprotect(base + static_cast<size_t>(r) * shard_bytes, shard_bytes, PROT_NONE), 0);
    } else {
      std::fill_n(buf + ShardOffset(n, p, r), ShardCount(n, p, r), static_cast<float>(me + 1));
    }
  }
  Status st = shm_->AllReduce(buf, buf, n, DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kBackendError) << st.ToString();
  EXPECT_NE(st.message().find("process_vm_readv"), std::string::npos) << st.message();
  if (p > 1 && bad != 0) {
    // Rank 0's failure comes first: its read of the bad rank's input.
    EXPECT_NE(st.message().find(StrCat("node rank 0 could not read node rank ", bad, "'s buffer")),
              std::string::npos)
        << st.message();
  }
  EXPECT_TRUE(SameStatusOnEveryRank(st)) << st.ToString();
  munmap(map, bytes);
  // Still in step: a good allreduce of the same size, single copy again, sums exactly.
  std::vector<float> good(n, static_cast<float>(me + 1)), sum(n);
  ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(good.data(), sum.data(), n, DType::kFloat32)));
  const float want = static_cast<float>(p * (p + 1) / 2);
  EXPECT_TRUE(OnEveryRank(std::all_of(sum.begin(), sum.end(), [&](float v) { return v == want; })));
}

// The single-copy broadcast, root's side: the root's buffer cannot be read (it never touches
// it itself in this path). Every receiver fails naming the root, the root fails naming its
// first receiver, nothing crashes, and the next broadcast and allreduce are exact.
TEST_F(ShmSingleCopy, UnreadableRootBufferFailsEveryBroadcastRank) {
  const int p = World()->size(), me = World()->rank(), root = p - 1;
  const size_t page = PageBytes(), bytes = 4 * page, n = bytes / sizeof(float);
  float* buf = MapPages(4);
  ASSERT_NE(buf, nullptr);
  std::fill_n(buf, n, me == root ? 7.0f : -1.0f);
  // Only the last page: the receivers' reads fail part-way through.
  if (me == root) {
    ASSERT_EQ(mprotect(reinterpret_cast<unsigned char*>(buf) + 3 * page, page, PROT_NONE), 0);
  }
  Status st = shm_->Broadcast(buf, n, DType::kFloat32, root);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kBackendError)) << st.ToString();
  const int named = me == root ? 0 : me;
  EXPECT_NE(st.message().find(StrCat("node rank ", named, " could not read node rank ", root,
                                     "'s buffer (process_vm_readv")),
            std::string::npos)
      << st.message();
  munmap(buf, bytes);
  std::vector<float> good(n + 3, me == 0 ? 5.0f : -1.0f);
  ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(good.data(), n + 3, DType::kFloat32, 0)));
  EXPECT_TRUE(
      OnEveryRank(std::all_of(good.begin(), good.end(), [](float v) { return v == 5.0f; })));
  ExpectInStep();
}

// The single-copy broadcast, a receiver's side: its own buffer cannot be written (read-only
// pages). That receiver and the root fail, naming it; the other receivers have the root's data
// and return OK; nothing is carried into the next call, which is exact on every rank.
TEST_F(ShmSingleCopy, UnwritableBufferOnOneReceiverFailsItAndTheRoot) {
  const int p = World()->size(), me = World()->rank(), bad = p - 1;
  const size_t bytes = 2 * PageBytes(), n = bytes / sizeof(float);
  float* buf = MapPages(2);
  ASSERT_NE(buf, nullptr);
  std::fill_n(buf, n, me == 0 ? 3.0f : -1.0f);
  if (me == bad) {
    ASSERT_EQ(mprotect(buf, bytes, PROT_READ), 0);
  }
  Status st = shm_->Broadcast(buf, n, DType::kFloat32, 0);
  if (me == 0 || me == bad) {
    EXPECT_EQ(st.code(), StatusCode::kBackendError) << st.ToString();
    EXPECT_NE(st.message().find(StrCat("node rank ", bad, " could not read node rank 0's buffer")),
              std::string::npos)
        << st.message();
  } else {
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(std::all_of(buf, buf + n, [](float v) { return v == 3.0f; }));
  }
  munmap(buf, bytes);
  ExpectInStep();
}

// Counts that differ across ranks where the single-copy broadcast starts (here 64 KiB) put ranks
// on different paths: the root and the odd rank fail in the call, whichever path each took, and
// nobody waits for a step another rank will not make. Receivers that matched a single-copy
// root have its data, whole although the root overwrites its buffer as soon as it returns (it
// waits for their reads), and fail their next call with the root's failure (a one-piece
// broadcast's way); after that the window is in step. The single-copy root's case repeats:
// the root's return and the receivers' reads race.
TEST(ShmSingleCopyBroadcast, CountOnOneRankOnTheOtherPathFailsWithoutAHang) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto s = ShmCollectives::Create(World()->mpi_comm(), 8192, 60.0, size_t{64} << 10);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::unique_ptr<ShmCollectives> shm = std::move(s).value();
  if (shm->single_copy_bcast_bytes() == 0) {
    GTEST_SKIP() << "this kernel refuses the single-copy path: " << shm->single_copy_note();
  }
  const int p = World()->size(), me = World()->rank();
  const bool odd = me == p - 1;
  const size_t direct = (size_t{96} << 10) / sizeof(float), window = 3000;  // 12000 B: 2 pieces
  for (int round = 0; round < 11; ++round) {
    const bool root_direct = round < 10;
    const size_t mine = odd == root_direct ? window : direct;
    std::vector<float> b(std::max(direct, window), me == 0 ? 4.0f : -1.0f);
    Status st = shm->Broadcast(b.data(), mine, DType::kFloat32, 0);
    if (me == 0) std::fill(b.begin(), b.end(), -7.0f);
    // Matched a single-copy root: a receiver that read it (only with one more rank).
    const bool matched = root_direct && me != 0 && !odd;
    if (matched) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(std::all_of(b.begin(), b.begin() + static_cast<long>(direct),
                              [](float v) { return v == 4.0f; }));
    } else {
      EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
      EXPECT_NE(st.message().find("element count differs across ranks"), std::string::npos)
          << st.message();
    }
    std::vector<float> x(9, 1.0f), y(9);
    st = shm->AllReduce(x.data(), y.data(), 9, DType::kFloat32);
    if (root_direct && p > 2) {
      EXPECT_TRUE(OnEveryRank(!st.ok())) << st.ToString();
      EXPECT_NE(st.message().find("element count differs across ranks"), std::string::npos)
          << st.message();
      st = shm->AllReduce(x.data(), y.data(), 9, DType::kFloat32);
    }
    ASSERT_TRUE(OkOnEveryRank(st));
    EXPECT_TRUE(OnEveryRank(y[8] == static_cast<float>(p)));
  }
  // And a good single-copy broadcast from another root.
  std::vector<float> c(direct, me == p - 1 ? 6.0f : -1.0f);
  ASSERT_TRUE(OkOnEveryRank(shm->Broadcast(c.data(), direct, DType::kFloat32, p - 1)));
  EXPECT_TRUE(OnEveryRank(std::all_of(c.begin(), c.end(), [](float v) { return v == 6.0f; })));
}

// Single-copy broadcasts (from 64 KiB here) among window broadcasts of one piece and of
// several, from the same root in a row and from two roots, exact on every rank; each window
// ends with a single-copy broadcast after which every rank destroys its object at once, so a
// receiver may leave while the root still looks for its mark: the root must still return OK.
TEST(ShmSingleCopyBroadcast, AmongWindowBroadcastsAndRightBeforeTheWindowGoes) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int p = World()->size(), me = World()->rank();
  size_t wrong = 0, failed = 0;
  std::string first;
  for (int round = 0; round < 4; ++round) {
    auto s = ShmCollectives::Create(World()->mpi_comm(), 8192, 60.0, size_t{64} << 10);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::unique_ptr<ShmCollectives> shm = std::move(s).value();
    if (shm->single_copy_bcast_bytes() == 0) {
      GTEST_SKIP() << "this kernel refuses the single-copy path: " << shm->single_copy_note();
    }
    // 80 KB (single copy), 2 KB (one piece), 20 KB (three pieces); roots 0, 0, last, ...
    const size_t sizes[] = {20000, 500, 5000};
    for (int k = 0; k < 7; ++k) {
      const size_t n = k == 6 ? 20000 : sizes[k % 3];
      const int root = (k / 2) % 2 == 0 ? 0 : p - 1;
      auto value = [&](size_t i) { return static_cast<float>(round * 100 + k) + F(i); };
      std::vector<float> b(n, -1.0f);
      if (me == root) {
        for (size_t i = 0; i < n; ++i) b[i] = value(i);
      }
      Status st = shm->Broadcast(b.data(), n, DType::kFloat32, root);
      if (k == 6) shm.reset();  // at once: no call in between
      if (!st.ok() && failed++ == 0) first = st.ToString();
      for (size_t i = 0; i < n; ++i) wrong += b[i] != value(i);
    }
  }
  EXPECT_TRUE(OnEveryRank(failed == 0)) << failed << " calls failed; the first: " << first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// The default (kSingleCopyAuto): Create times both ways and keeps, on every rank alike, the
// single copy for the calls it ran faster: allgathers and allreduces where every rank has a
// core; where ranks outnumber cores it keeps the window for those and times broadcasts (single
// copy from 1 MiB if faster). Each call then gives exact results.
TEST(ShmSingleCopyAuto, MeasuresAndAgreesOnEveryRank) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto s = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0,
                                  ShmCollectives::kSingleCopyAuto);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::unique_ptr<ShmCollectives> shm = std::move(s).value();
  EXPECT_EQ(shm->single_copy_requested(), ShmCollectives::kSingleCopyAuto);
  const std::string& note = shm->single_copy_note();
  if (note.find("process_vm_readv") != std::string::npos ||
      note.find("probe failed") != std::string::npos) {
    GTEST_SKIP() << "this kernel refuses the single-copy path: " << note;
  }
  const int p = World()->size(), me = World()->rank();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const size_t gather_on = ShmCollectives::kAutoGatherSingleCopyBytes;
  const size_t reduce_on = ShmCollectives::kAutoSingleCopyBytes;
  uint64_t ways[3] = {shm->single_copy_bytes(), shm->single_copy_reduce_bytes(),
                      shm->single_copy_bcast_bytes()};
  if (cores > 0 && p > cores) {
    EXPECT_NE(note.find("ranks outnumber cores"), std::string::npos) << note;
    EXPECT_NE(note.find("measured at creation"), std::string::npos) << note;
    EXPECT_EQ(ways[0], 0u);
    EXPECT_EQ(ways[1], 0u);
    EXPECT_TRUE(ways[2] == 0 || ways[2] == ShmCollectives::kAutoBroadcastSingleCopyBytes)
        << ways[2];
  } else {
    EXPECT_NE(note.find("measured at creation"), std::string::npos) << note;
    EXPECT_TRUE(ways[0] == 0 || ways[0] == gather_on) << ways[0];
    EXPECT_TRUE(ways[1] == 0 || ways[1] == reduce_on) << ways[1];
    EXPECT_EQ(ways[2], 0u);
  }
  EXPECT_TRUE(SameOnEveryRank(ways, sizeof(ways))) << note;
  const size_t n = (size_t{3} << 20) / sizeof(float) + 5;
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((me + 1) * (i % 97));
  ASSERT_TRUE(OkOnEveryRank(shm->AllReduce(in.data(), out.data(), n, DType::kFloat32)));
  bool exact = true;
  for (size_t i = 0; i < n && exact; ++i) {
    exact = out[i] == static_cast<float>(p * (p + 1) / 2 * static_cast<int>(i % 97));
  }
  EXPECT_TRUE(OnEveryRank(exact));
  std::vector<float> all(n * static_cast<size_t>(p));
  ASSERT_TRUE(OkOnEveryRank(shm->AllGather(in.data(), all.data(), n, DType::kFloat32)));
  exact = true;
  for (size_t i = 0; i < all.size() && exact; ++i) {
    exact = all[i] == static_cast<float>((i / n + 1) * ((i % n) % 97));
  }
  EXPECT_TRUE(OnEveryRank(exact));
  // A broadcast of 3 MiB and a bit from the last rank (the way measured where ranks outnumber
  // cores).
  const int root = p - 1;
  std::vector<float> b(n, -1.0f);
  if (me == root) b = in;
  ASSERT_TRUE(OkOnEveryRank(shm->Broadcast(b.data(), n, DType::kFloat32, root)));
  exact = true;
  for (size_t i = 0; i < n && exact; ++i) exact = b[i] == static_cast<float>(p * (i % 97));
  EXPECT_TRUE(OnEveryRank(exact));
}

TEST(ShmErrors, BadChunkSettingIsReportedByTheBackend) {
  ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", "1").ok());
  ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_CHUNK_BYTES", "64").ok());
  std::vector<float> x(16, 1.0f);
  Status st = World()->host_backend().AllReduce(x.data(), x.data(), x.size(), DType::kFloat32);
  Settings::Global().Reset();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // The backend still works afterwards.
  std::vector<float> y(16, 1.0f);
  ASSERT_TRUE(World()->host_backend().AllReduce(y.data(), y.data(), y.size(), DType::kFloat32).ok());
  EXPECT_EQ(y[3], static_cast<float>(World()->size()));
}

TEST(ShmReduceSum, SumsInRankOrderAndAllowsAliasing) {
  const size_t n = 2500;  // crosses the 1024-element block boundary
  std::vector<float> a(n), b(n), c(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 1e8f;
    b[i] = -1e8f;
    c[i] = 0.5f + static_cast<float>(i);
  }
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  ShmReduceSum(DType::kFloat32, srcs, 3, a.data(), n);  // (a + b) + c, written over a
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], 0.5f + static_cast<float>(i)) << i;

  // Halves: 3 x 0.1 rounded once from float32, not after every addition.
  uint16_t h = FloatToHalf(0.1f);
  std::vector<uint16_t> x(n, h), out(n);
  const void* hs[3] = {x.data(), x.data(), x.data()};
  ShmReduceSum(DType::kFloat16, hs, 3, out.data(), n);
  float f = HalfToFloat(h);
  EXPECT_EQ(out[n - 1], FloatToHalf(f + f + f));
  std::vector<int64_t> big(n, int64_t{1} << 40), sum(n);
  const void* is[2] = {big.data(), big.data()};
  ShmReduceSum(DType::kInt64, is, 2, sum.data(), n);
  EXPECT_EQ(sum[7], int64_t{1} << 41);
}

// The streaming copy-out (outputs of 16 MiB and more, which the collectives' tests
// do not reach): every byte lands, whatever the destination's alignment and the length's tail.
TEST(ShmCopyOut, StreamingCopiesEveryByteAtAnyAlignment) {
  const size_t n = 4099;  // 64-byte blocks plus a tail
  std::vector<unsigned char> src(n + 64), dst(n + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t shift : {0, 1, 5, 15, 16, 33}) {
    for (size_t len : {size_t{0}, size_t{255}, size_t{256}, size_t{1000}, n}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      CopyOut(dst.data() + shift, src.data() + 3, len, true);
      StreamFence();
      ASSERT_EQ(std::memcmp(dst.data() + shift, src.data() + 3, len), 0)
          << "shift " << shift << " len " << len;
      for (size_t i = 0; i < shift; ++i) ASSERT_EQ(dst[i], 0xEE) << "before, shift " << shift;
      for (size_t i = shift + len; i < dst.size(); ++i) {
        ASSERT_EQ(dst[i], 0xEE) << "after, shift " << shift << " len " << len;
      }
    }
  }
}

// The window the broadcast and sleeper tests below use (8 KiB slots), and the calls of theirs
// that failed: how many, and the first one's status (they go on after a failure, to count wrong
// elements too).
void SmallWindow(std::unique_ptr<ShmCollectives>* shm) {
  auto made = ShmCollectives::Create(World()->mpi_comm(), 8192, 60.0);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  *shm = std::move(made).value();
}
struct Failures {
  size_t count = 0;
  std::string first;
  void Note(const Status& st) {
    if (!st.ok() && count++ == 0) first = st.ToString();
  }
};
// A window with 1 MiB slots and the single copy off: large calls go through the window.
void WideWindow(std::unique_ptr<ShmCollectives>* shm) {
  auto made = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0, 0);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  *shm = std::move(made).value();
}
// An allreduce of three ones after a call with streamed outputs (whose stores are fenced
// before it returns), its failure and its wrong elements counted.
void SmallAllReduceAfter(ShmCollectives* shm, Failures* failed, size_t* wrong) {
  std::vector<float> x(3, 1.0f), y(3);
  failed->Note(shm->AllReduce(x.data(), y.data(), 3, DType::kFloat32));
  for (float v : y) *wrong += v != static_cast<float>(World()->size());
}

// Small broadcasts return on their root without waiting for the receivers (ShmCollectives,
// "Broadcast"): a long sequence of them from rotating roots, of one slot and of several, with
// allreduces and barriers between them and a receiver that is often late, so that roots run
// ahead; every rank checks every element it received. The object is destroyed right after a
// small broadcast (its destructor settles it).
TEST(ShmBroadcast, RootsRunAheadOfLateReceivers) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(SmallWindow(&shm));
  const int p = World()->size(), me = World()->rank();
  size_t wrong = 0;
  Failures failed;
  for (int i = 0; i < 300; ++i) {
    const int root = i % p;
    // Mostly one slot (8 KiB: 2048 floats) or less; every fifth call several rounds.
    const size_t n = i % 5 == 4 ? 2048 * 3 + 17 : 1 + static_cast<size_t>(i * 37) % 2048;
    std::vector<float> b(n, -1.0f);
    if (me == root) {
      for (size_t j = 0; j < n; ++j) b[j] = static_cast<float>(root * 1000 + i + j % 13);
    } else if (me == (i / 3) % p && i % 2 == 0) {
      usleep(200);  // a late receiver: the root goes on without it
    }
    failed.Note(shm->Broadcast(b.data(), n, DType::kFloat32, root));
    for (size_t j = 0; j < n; ++j) {
      wrong += b[j] != static_cast<float>(root * 1000 + i + j % 13);
    }
    if (i % 7 == 3) {
      std::vector<float> x(5, static_cast<float>(me + 1)), y(5);
      failed.Note(shm->AllReduce(x.data(), y.data(), 5, DType::kFloat32));
      for (float v : y) wrong += v != static_cast<float>(p * (p + 1) / 2);
    }
    if (i % 11 == 5) failed.Note(shm->Agree({"Barrier", 0, 0, -1, 0, Status::Ok()}));
  }
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
  std::vector<float> last(3, me == 1 % p ? 7.0f : 0.0f);
  ASSERT_TRUE(OkOnEveryRank(shm->Broadcast(last.data(), 3, DType::kFloat32, 1 % p)));
  EXPECT_EQ(last[2], 7.0f);
  shm.reset();
}

// Broadcasts from one root in a row: a receiver skips waiting for the other receivers at the
// start of its next one (ShmCollectives, "Broadcast"), so receivers run ahead of one another,
// bounded only by the root. Back to back, with no other call between most of them, a late
// receiver that moves, and every tenth broadcast of several pieces; every rank checks every
// element, and the descriptors a late rank still reads must not be overwritten under it.
TEST(ShmBroadcast, ReceiversOfOneRootRunAheadOfEachOther) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(SmallWindow(&shm));
  const int p = World()->size(), me = World()->rank(), root = p - 1;
  size_t wrong = 0;
  Failures failed;
  for (int i = 0; i < 600; ++i) {
    const size_t n = i % 10 == 9 ? 2048 * 2 + 5 : 1 + static_cast<size_t>(i * 53) % 1500;
    auto want = [&](size_t j) { return static_cast<float>(i * 7 + static_cast<int>(j % 29)); };
    std::vector<float> b(n, -1.0f);
    if (me == root) {
      for (size_t j = 0; j < n; ++j) b[j] = want(j);
    } else if (me == (i / 20) % p && i % 3 == 0) {
      usleep(100);  // this receiver falls behind the others
    }
    Status st = shm->Broadcast(b.data(), n, DType::kFloat32, root);
    failed.Note(st);
    for (size_t j = 0; j < n; ++j) wrong += b[j] != want(j);
    if (i % 97 == 96) {
      std::vector<float> x(3, 1.0f), y(3);
      st = shm->AllReduce(x.data(), y.data(), 3, DType::kFloat32);
      failed.Note(st);
      for (float v : y) wrong += v != static_cast<float>(p);
    }
  }
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// A broadcast through the window from where its streaming stores start (bcast_stream_bytes():
// at least 16 MiB, at most 160 MiB here) writes the receivers' outputs with streaming stores,
// in 512 KiB pieces: a length with a tail that fills no 64-byte block, from two roots, every
// element checked, and a small allreduce after each (the stores are fenced before the call
// returns).
TEST(ShmBroadcast, StreamedOutputsOfLargeBroadcastsAreExact) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(WideWindow(&shm));
  const int p = World()->size(), me = World()->rank();
  const size_t bytes = std::max(size_t{16} << 20, shm->bcast_stream_bytes());
  if (bytes > (size_t{160} << 20)) {
    GTEST_SKIP() << "streaming starts at " << bytes << " bytes on this machine";
  }
  const size_t n = bytes / sizeof(float) + 5;
  size_t wrong = 0;
  Failures failed;
  for (int root : {0, p - 1}) {
    auto want = [&](size_t j) {
      return static_cast<float>(root * 131 + static_cast<int>(j % 1009));
    };
    std::vector<float> b(n, -1.0f);
    if (me == root) {
      for (size_t j = 0; j < n; ++j) b[j] = want(j);
    }
    failed.Note(shm->Broadcast(b.data(), n, DType::kFloat32, root));
    for (size_t j = 0; j < n; ++j) wrong += b[j] != want(j);
    SmallAllReduceAfter(shm.get(), &failed, &wrong);
  }
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// Where the streaming stores start, the same on every rank. Where ranks outnumber cores: an
// allgather's at 8 MiB (the gathered buffer), a broadcast's at 16 MiB. Else at 16 MiB, or
// further where the last-level cache holds P + 1 gathered buffers of 16 MiB (an allgather) or
// 3 x P buffers of 16 MiB (a broadcast): then at the smallest size past the cache
// (kGatherStreamBytes, kBroadcastStreamBytes in shm_collectives.cc).
TEST(ShmStreaming, StartsWhereTheBuffersOutgrowTheCache) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(WideWindow(&shm));
  const int p = World()->size();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const bool crowded = cores > 0 && p > cores;
  const size_t sixteen = size_t{16} << 20;
  auto check = [&](const char* what, size_t from, size_t buffers) {
    EXPECT_GE(from, sixteen) << what;
    if (!crowded && llc > 0) {
      const size_t cache = static_cast<size_t>(llc);
      EXPECT_GT(buffers * from, cache) << what << ": " << from << " bytes, cache " << llc;
      EXPECT_TRUE(from == sixteen || buffers * (from - 1) <= cache)
          << what << ": " << from << " bytes, cache " << llc;
    } else {
      EXPECT_EQ(from, sixteen) << what;
    }
    EXPECT_TRUE(SameOnEveryRank(&from, sizeof(from))) << what << ": " << from;
  };
  if (crowded) {
    EXPECT_EQ(shm->gather_stream_bytes(), size_t{8} << 20);
  } else {
    check("allgather", shm->gather_stream_bytes(), static_cast<size_t>(p + 1));
  }
  check("broadcast", shm->bcast_stream_bytes(), 3 * static_cast<size_t>(p));
}

// An allgather through the window from where its streaming stores start (gather_stream_bytes(),
// above; at least 16 MiB, at most 160 MiB here) writes its output with streaming stores, in
// rounds of 256 KiB per rank: parts with a tail that fills no 64-byte block, every element
// checked, and a small allreduce after it (the stores are fenced before the call returns).
TEST(ShmAllGather, StreamedOutputsOfLargeGathersAreExact) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(WideWindow(&shm));
  const int p = World()->size(), me = World()->rank();
  const size_t gathered = std::max(size_t{16} << 20, shm->gather_stream_bytes());
  if (gathered > (size_t{160} << 20)) {
    GTEST_SKIP() << "streaming starts at " << gathered << " gathered bytes on this machine";
  }
  const size_t n = gathered / sizeof(float) / static_cast<size_t>(p) + 3;
  auto want = [](int r, size_t j) {
    return static_cast<float>(r * 131 + static_cast<int>(j % 1009));
  };
  std::vector<float> in(n), out(n * static_cast<size_t>(p), -1.0f);
  for (size_t j = 0; j < n; ++j) in[j] = want(me, j);
  Failures failed;
  failed.Note(shm->AllGather(in.data(), out.data(), n, DType::kFloat32));
  size_t wrong = 0;
  for (int r = 0; r < p; ++r) {
    for (size_t j = 0; j < n; ++j) wrong += out[static_cast<size_t>(r) * n + j] != want(r, j);
  }
  SmallAllReduceAfter(shm.get(), &failed, &wrong);
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// The single-copy allgather of 16 MiB and more, where its streaming stores start there (ranks
// outnumbering cores, or a last-level cache that cannot hold P + 1 such buffers), reads each
// peer's part in blocks and writes it out with streaming stores, its own part too
// (kGatherStreamBytes, kGatherBounceBytes in shm_collectives.cc); else it reads each part
// straight into the output, checked the same way: parts whose lengths differ by rank and fill
// neither a block nor a 64-byte line, out of place and in place, every element checked, and a
// small allreduce after each.
TEST_F(ShmSingleCopy, StreamedGathersAreExact) {
  const int p = World()->size(), me = World()->rank();
  std::vector<size_t> counts(static_cast<size_t>(p)), offsets(static_cast<size_t>(p));
  size_t total = 0;
  const size_t base = (size_t{16} << 20) / sizeof(float) / static_cast<size_t>(p);
  for (int r = 0; r < p; ++r) {
    counts[static_cast<size_t>(r)] = base + 7 * static_cast<size_t>(r) + 3;
    offsets[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  auto want = [](int r, size_t j) {
    return static_cast<float>(r * 131 + static_cast<int>(j % 1009));
  };
  const size_t n = counts[static_cast<size_t>(me)], at = offsets[static_cast<size_t>(me)];
  std::vector<float> in(n), out(total);
  for (size_t j = 0; j < n; ++j) in[j] = want(me, j);
  Failures failed;
  size_t wrong = 0;
  for (bool in_place : {false, true}) {
    std::fill(out.begin(), out.end(), -1.0f);
    if (in_place) std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
    const float* send = in_place ? out.data() + at : in.data();
    failed.Note(shm_->AllGatherV(send, out.data(), counts, DType::kFloat32));
    for (int r = 0; r < p; ++r) {
      for (size_t j = 0; j < counts[static_cast<size_t>(r)]; ++j) {
        wrong += out[offsets[static_cast<size_t>(r)] + j] != want(r, j);
      }
    }
    SmallAllReduceAfter(shm_.get(), &failed, &wrong);
  }
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// An allreduce through the window of 16 MiB and more writes its output with streaming stores
// (kReduceStreamBytes in shm_collectives.cc), in 512 KiB chunks (kReducePieceBytes, below the
// 1 MiB slot): a length with a tail that fills neither a chunk nor a 64-byte block, out of place
// and in place, every element checked, and a small allreduce after each (the stores are fenced
// before the call returns). Then a reduce-scatter of several rounds through the same window.
TEST(ShmAllReduce, StreamedOutputsOfLargeAllReducesAreExact) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(WideWindow(&shm));
  const int p = World()->size(), me = World()->rank();
  const size_t n = (size_t{16} << 20) / sizeof(float) + 37;
  auto part = [](size_t j) { return static_cast<float>(j % 1009); };
  const float ranks_sum = static_cast<float>(p * (p + 1) / 2);
  std::vector<float> in(n), out(n, -1.0f);
  for (size_t j = 0; j < n; ++j) in[j] = static_cast<float>(me + 1) * part(j);
  Failures failed;
  size_t wrong = 0;
  failed.Note(shm->AllReduce(in.data(), out.data(), n, DType::kFloat32));
  for (size_t j = 0; j < n; ++j) wrong += out[j] != ranks_sum * part(j);
  SmallAllReduceAfter(shm.get(), &failed, &wrong);
  failed.Note(shm->AllReduce(in.data(), in.data(), n, DType::kFloat32));
  for (size_t j = 0; j < n; ++j) wrong += in[j] != ranks_sum * part(j);
  SmallAllReduceAfter(shm.get(), &failed, &wrong);
  // A reduce-scatter of several rounds (where ranks outnumber cores, of 512 KiB in all), the
  // counts differing by rank: rank r gets its slice of the ranks' inputs, summed.
  std::vector<size_t> counts(static_cast<size_t>(p));
  size_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[static_cast<size_t>(r)] = 300007 + 1031 * r;
  std::vector<float> all(total), mine(counts[static_cast<size_t>(me)], -1.0f);
  for (size_t j = 0; j < total; ++j) all[j] = static_cast<float>(me + 1) * part(j);
  failed.Note(shm->ReduceScatter(all.data(), mine.data(), counts, DType::kFloat32));
  size_t first = 0;
  for (int r = 0; r < me; ++r) first += counts[static_cast<size_t>(r)];
  for (size_t j = 0; j < mine.size(); ++j) wrong += mine[j] != ranks_sum * part(first + j);
  SmallAllReduceAfter(shm.get(), &failed, &wrong);
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// Waiters that go to sleep: one rank, a different one each time, is late by 2 ms (past the
// 200 us of yield-polling), so its peers sleep on its arrival word and its arrival (a plain
// store where the kernel offers the waiters' barrier, see ShmCollectives::Arrive) must wake
// them. Allreduces and broadcasts from the late rank, every element checked.
TEST(ShmSleepers, LateRankWakesItsSleepingPeers) {
  std::unique_ptr<ShmCollectives> shm;
  ASSERT_NO_FATAL_FAILURE(SmallWindow(&shm));
  const int p = World()->size(), me = World()->rank();
  size_t wrong = 0;
  Failures failed;
  for (int i = 0; i < 24; ++i) {
    const int late = i % p;
    if (me == late) usleep(2000);
    std::vector<float> x(3, static_cast<float>(me + i)), y(3, -1.0f);
    failed.Note(shm->AllReduce(x.data(), y.data(), 3, DType::kFloat32));
    for (float v : y) wrong += v != static_cast<float>(p * (p - 1) / 2 + p * i);
    if (me == late) usleep(2000);
    std::vector<float> b(5, me == late ? static_cast<float>(i) : -1.0f);
    failed.Note(shm->Broadcast(b.data(), b.size(), DType::kFloat32, late));
    for (float v : b) wrong += v != static_cast<float>(i);
  }
  EXPECT_TRUE(OnEveryRank(failed.count == 0))
      << failed.count << " calls failed; the first: " << failed.first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
}

// ---- The agreement carried in the window (ShmCollectives "Agreement"). ----
// Every case: one rank (the last) disagrees; every rank fails the same way at once (a small
// broadcast: its root and the ranks that agree with it at their next call), and the window
// stays usable for the next call (checked with an exact allreduce after each).

class ShmAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ShmCollectives::Create(World()->mpi_comm(), 8192, 60.0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shm_ = std::move(s).value();
  }
  void TearDown() override { shm_.reset(); }
  int rank() { return World()->rank(); }
  int size() { return World()->size(); }
  bool odd() { return rank() == size() - 1; }
  // Where ranks outnumber cores, or at P = 2, a reduce-scatter's ranks with nothing to receive
  // return early (their failure comes one call late).
  bool EmptyRanksReturnEarly() {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return (cores > 0 && size() > cores) || size() == 2;
  }
  // An exact allreduce still works after a failed call (the window is not broken), with
  // values no earlier call used: a rank reading a peer's stale slot (ranks that disagree about
  // the stage after a failure) gets a wrong sum.
  void ExpectUsable(size_t n) {
    const double salt = 100.0 * ++usable_calls_;
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((rank() + 1) * F(i) + salt);
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(x.data(), y.data(), n, DType::kFloat32)));
    const double tri = size() * (size() + 1) / 2.0;
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(y[i]); },
                         [&](size_t i) { return tri * F(i) + salt * size(); }));
    EXPECT_FALSE(shm_->broken());
  }
  int usable_calls_ = 0;
  // n successful broadcasts of 12 floats from rank 0 (values first, first + 1, ...): they leave
  // stamps of the same call, but for its index, in the root's slots.
  void EqualBroadcasts(int n, float first) {
    for (int i = 0; i < n; ++i) {
      std::vector<float> a(12, rank() == 0 ? first + static_cast<float>(i) : -1.0f);
      ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(a.data(), 12, DType::kFloat32, 0)));
    }
  }
  // After a call that some ranks returned from before checking the others (a small broadcast's
  // root and the ranks that agree with it; a reduce-scatter's ranks with nothing to receive,
  // where ranks outnumber cores) and one rank failed: the next call fails on every rank, those that returned OK with the
  // call's failure as their own, the rank that failed (`failed`, the last one by default)
  // naming the first rank that returned (`named`).
  void ExpectFailureCarriedToTheNextCall(const std::string& cause,
                                         const std::string& call = "Broadcast", int failed = -1,
                                         int named = 0) {
    if (failed < 0) failed = size() - 1;
    std::vector<float> x(4, 1.0f), y(4);
    Status st = shm_->AllReduce(x.data(), y.data(), 4, DType::kFloat32);
    EXPECT_TRUE(OnEveryRank(!st.ok())) << st.ToString();
    EXPECT_NE(st.message().find("AllReduce: the previous collective on this communicator (" +
                                call + ") returned here before its peers found: "),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(cause), std::string::npos) << st.message();
    if (rank() == failed) {
      // The first rank that returned carries the failure with its code: an invalid argument
      // as one, anything else as "failed the call".
      const bool invalid = st.code() == StatusCode::kInvalidArgument;
      EXPECT_NE(st.message().find(StrCat("rank ", named, invalid ? " passed an invalid argument"
                                                                 : " failed the call")),
                std::string::npos)
          << st.message();
    }
  }
  std::unique_ptr<ShmCollectives> shm_;
};

TEST_F(ShmAgreement, CountDiffersOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  // One-shot (small), pipelined (several stages at 8 KiB slots), and one rank with nothing.
  for (size_t n : {size_t{5}, size_t{6000}, size_t{0}}) {
    const size_t other = n == 0 ? 3 : n + 3;  // the last rank's count
    const size_t mine = odd() ? other : n;
    std::vector<float> x(mine + 1, 1.0f), y(mine + 1);
    Status st = shm_->AllReduce(x.data(), y.data(), mine, DType::kFloat32);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find(StrCat("element count differs across ranks (",
                                       testing::OneOddGroups(size() - 1, std::to_string(n),
                                                             std::to_string(other)),
                                       ")")),
              std::string::npos)
        << st.message();
    ExpectUsable(n + 100);
  }
}

TEST_F(ShmAgreement, DifferentCollectivesOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<float> x(64, 1.0f), y(64 * static_cast<size_t>(size()));
  Status st = odd() ? shm_->Broadcast(x.data(), 64, DType::kFloat32, 0)
                    : shm_->AllReduce(x.data(), y.data(), 64, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find(StrCat("ranks called different collectives (rank 0: AllReduce, rank ",
                                     size() - 1, ": Broadcast)")),
            std::string::npos)
      << st.message();
  ExpectUsable(100);
  st = odd() ? shm_->AllGather(x.data(), y.data(), 64, DType::kFloat32)
             : shm_->Agree({"Barrier", 0, 0, -1, 0, Status::Ok()});
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  ExpectUsable(3);
}

TEST_F(ShmAgreement, InvalidArgumentOnOneRankNamesIt) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  // A bad root on one rank only. The broadcast's root (rank 0) and the ranks that agree with it
  // return before checking the last rank, so they learn of the failure at their next call,
  // which then fails on every rank.
  std::vector<float> b(10, 1.0f);
  Status st = shm_->Broadcast(b.data(), 10, DType::kFloat32, odd() ? size() : 0);
  EXPECT_TRUE(OnEveryRank(odd() ? st.code() == StatusCode::kInvalidArgument : st.ok()))
      << st.ToString();
  if (odd()) {
    EXPECT_NE(st.message().find(StrCat("root ", size(), " is outside")), std::string::npos)
        << st.message();
  }
  ExpectFailureCarriedToTheNextCall(StrCat("root ", size(), " is outside"));
  ExpectUsable(2000);
  // A counts vector of the wrong length on one rank (reduce-scatter and allgatherv).
  std::vector<size_t> counts(static_cast<size_t>(size()) + (odd() ? 1 : 0), 4);
  std::vector<float> in(4 * counts.size(), 1.0f), out(4 * counts.size());
  st = shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
  st = shm_->AllGatherV(in.data(), out.data(), counts, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
  ExpectUsable(7);
}

// A rank that refuses a call before it starts (a binding's own checks: Backend::FailTogether,
// whose call name may not be the peers') fails its peers' call at once, naming it and why (a
// small broadcast's root and the ranks that agree with it: their next call).
TEST_F(ShmAgreement, RefusalOnOneRankFailsAnyCallOfThePeers) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<float> b(10, 1.0f);
  const CollectiveArgs refused{"AllReduce", -1, 0, -1, 0,
                               InvalidArgument("broadcast_: root_rank 9 is not in 0..8")};
  Status st = odd() ? shm_->Agree(refused) : shm_->Broadcast(b.data(), 10, DType::kFloat32, 0);
  EXPECT_TRUE(OnEveryRank(odd() ? st.code() == StatusCode::kInvalidArgument : st.ok()))
      << st.ToString();
  if (odd()) {
    EXPECT_NE(st.message().find("root_rank 9 is not in 0..8"), std::string::npos) << st.message();
  }
  ExpectFailureCarriedToTheNextCall("root_rank 9 is not in 0..8");
  ExpectUsable(5);
  // The same refusal of a broadcast of several rounds: every rank waits for every rank at the
  // first round, so the call fails on every rank, naming the last rank.
  std::vector<float> big(5000, 1.0f);
  st = odd() ? shm_->Agree(refused) : shm_->Broadcast(big.data(), 5000, DType::kFloat32, 0);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
  if (!odd()) {
    EXPECT_NE(st.message().find(StrCat("rank ", size() - 1, " passed an invalid argument")),
              std::string::npos)
        << st.message();
  }
  ExpectUsable(5);
}

// Every rank names itself the root of a small broadcast (hvd.broadcast(x, root_rank=rank())):
// every rank is a root, none waits, so the call returns OK everywhere; the next call fails on
// every rank naming the roots, and the window stays usable.
TEST_F(ShmAgreement, EveryRankItsOwnRootFailsTheNextCall) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<float> b(10, static_cast<float>(rank()));
  Status st = shm_->Broadcast(b.data(), 10, DType::kFloat32, rank());
  EXPECT_TRUE(OkOnEveryRank(st));
  std::vector<float> x(6, 1.0f);
  st = shm_->AllGather(x.data(), b.data(), 1, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find("AllGather: the previous collective on this communicator "
                              "(Broadcast) returned here before its peers found: Broadcast: root "
                              "differs across ranks"),
            std::string::npos)
      << st.message();
  ExpectUsable(9);
}

// A reduce-scatter of a few elements, all of them rank 0's: the other ranks receive nothing.
// The last rank's dtype differs. Where every rank has a core they still check the call, and
// every rank fails in it; where ranks outnumber cores they return once their data is in place,
// so rank 0 fails in the call and the others at their next call, which fails on every rank.
// Either way the window stays in step.
// Receivers that matched a small broadcast's root copy its data out while the root, already
// back, starts its next call. Where another rank failed the broadcast, the root's next call
// must still not write into the slot they read (it once did: the failed call's stage was given
// back, and a pickled object arrived with the next allreduce's input in its first bytes).
// Repeated: the copy and the root's next call race.
TEST_F(ShmAgreement, ReceiversThatMatchedTheRootGetItsDataWhereAnotherRankFails) {
  if (size() < 3) GTEST_SKIP() << "needs a root, a receiver that matches it and one that not";
  const size_t n = 2000;  // 8000 bytes: one piece at the fixture's 8 KiB slots
  size_t wrong = 0, unexpected = 0;
  std::string first;  // the first unexpected status
  for (int round = 0; round < 40; ++round) {
    auto expected = [&](size_t i) { return static_cast<float>(1000 + round) + F(i); };
    std::vector<float> buf(n + 1, -1.0f);
    if (rank() == 0) {
      for (size_t i = 0; i < n; ++i) buf[i] = expected(i);
    }
    // No MPI call between the broadcast and the next call (that would let the copies finish).
    Status st = shm_->Broadcast(buf.data(), odd() ? n + 1 : n, DType::kFloat32, 0);
    std::vector<float> x(4, 1.0f), y(4);
    Status next = shm_->AllReduce(x.data(), y.data(), 4, DType::kFloat32);
    const bool as_expected =
        (odd() ? st.code() == StatusCode::kMismatch : st.ok()) && !next.ok() &&
        next.message().find("returned here before its peers found") != std::string::npos;
    if (!as_expected && unexpected++ == 0) first = st.ToString() + " / " + next.ToString();
    if (!odd()) {
      for (size_t i = 0; i < n; ++i) wrong += buf[i] != expected(i);
    }
  }
  EXPECT_TRUE(OnEveryRank(unexpected == 0)) << unexpected << " rounds unexpected; " << first;
  EXPECT_TRUE(OnEveryRank(wrong == 0)) << wrong << " elements wrong";
  ExpectUsable(100);
}

// A receiver disagrees with the root in a row of broadcasts from that root: it fails in the
// call; the root and the receivers that matched it return OK, and the next broadcast from the
// same root (which those receivers start without waiting for the others) fails on every rank,
// carried by the root. The one after moves the root's data again.
// Three equal broadcasts first, so that the root's slots hold stamps equal to the next calls'
// but for their index: a root that fails before moving data writes none, and a receiver must not
// take an older one for it.
TEST_F(ShmAgreement, ReceiverThatDisagreesInARowOfBroadcastsFromOneRoot) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  ASSERT_NO_FATAL_FAILURE(EqualBroadcasts(3, 1.0f));
  std::vector<float> b(12, rank() == 0 ? 5.0f : -1.0f);
  Status st = shm_->Broadcast(b.data(), odd() ? 11 : 12, DType::kFloat32, 0);
  EXPECT_TRUE(OnEveryRank(odd() ? st.code() == StatusCode::kMismatch : st.ok())) << st.ToString();
  if (!odd()) {
    EXPECT_EQ(b[11], 5.0f);
  }
  st = shm_->Broadcast(b.data(), 12, DType::kFloat32, 0);
  // The root fails with the verdict, the others with the root's failure passed on, its code
  // kept ("rank 0 failed the call: ...").
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  if (rank() != 0) {
    EXPECT_NE(st.message().find("rank 0 failed the call"), std::string::npos) << st.message();
  }
  EXPECT_NE(st.message().find("Broadcast: the previous collective on this communicator "
                              "(Broadcast) returned here before its peers found: Broadcast: "
                              "element count differs across ranks"),
            std::string::npos)
      << st.message();
  std::vector<float> c(12, rank() == 0 ? 9.0f : -1.0f);
  EXPECT_TRUE(OkOnEveryRank(shm_->Broadcast(c.data(), 12, DType::kFloat32, 0)));
  EXPECT_TRUE(AllEqual(12, [&](size_t i) { return static_cast<double>(c[i]); },
                       [](size_t) { return 9.0; }));
  ExpectUsable(50);
}

// A root alone fails before its data moves (count 0 where the receivers pass 12): the receivers
// find no stamp of this call in its slot (only an equal older one) and fail with it, in the call.
TEST_F(ShmAgreement, RootThatFailsAloneFailsItsReceiversInTheCall) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  ASSERT_NO_FATAL_FAILURE(EqualBroadcasts(4, 2.0f));
  // Stage 4 reuses the slot of stage 1, whose stamp is the same call but for its index.
  std::vector<float> b(12, -1.0f);
  Status st = shm_->Broadcast(b.data(), rank() == 0 ? 0 : 12, DType::kFloat32, 0);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find("element count differs across ranks"), std::string::npos)
      << st.message();
  EXPECT_TRUE(OnEveryRank(rank() == 0 || b[0] == -1.0f)) << "a receiver took old data";
  ExpectUsable(40);
}

// A refused broadcast, then broadcasts from rotating roots: the failure is carried into the next
// call once (its root, the rank that refused the first one, returns early and OK; every other
// rank fails it) and no further: the calls after it succeed everywhere, with the roots' data.
TEST_F(ShmAgreement, FailureCarriedOnceWhenRootsRotate) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const int last = size() - 1;
  std::vector<float> b(12, rank() == 0 ? 5.0f : -1.0f);
  Status st = shm_->Broadcast(b.data(), odd() ? 11 : 12, DType::kFloat32, 0);
  EXPECT_TRUE(OnEveryRank(odd() ? st.code() == StatusCode::kMismatch : st.ok())) << st.ToString();
  st = shm_->Broadcast(b.data(), 12, DType::kFloat32, last);
  EXPECT_TRUE(OnEveryRank(odd() ? st.ok() : st.code() == StatusCode::kMismatch)) << st.ToString();
  if (!odd()) {
    EXPECT_NE(st.message().find("returned here before its peers found"), std::string::npos)
        << st.message();
  }
  for (int i = 0; i < 2 * size(); ++i) {
    const int root = i % size();
    std::vector<float> c(12, rank() == root ? 10.0f + i : -1.0f);
    EXPECT_TRUE(OkOnEveryRank(shm_->Broadcast(c.data(), 12, DType::kFloat32, root)))
        << "broadcast " << i << " after the failure";
    EXPECT_TRUE(OnEveryRank(c[11] == 10.0f + i)) << "broadcast " << i;
  }
  ExpectUsable(30);
}

TEST_F(ShmAgreement, ReduceScatterWithNothingToReceive) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const bool early = EmptyRanksReturnEarly();
  std::vector<size_t> counts(static_cast<size_t>(size()), 0);
  counts[0] = 3;
  std::vector<float> in(3, 1.0f), out(3, 0.0f);
  Status st = shm_->ReduceScatter(in.data(), out.data(), counts,
                                  odd() ? DType::kInt32 : DType::kFloat32);
  if (early) {
    EXPECT_TRUE(OnEveryRank(rank() == 0 ? st.code() == StatusCode::kMismatch : st.ok()))
        << st.ToString();
    ExpectFailureCarriedToTheNextCall("dtype differs across ranks", "ReduceScatter", 0, 1);
  } else {
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find("dtype differs across ranks"), std::string::npos)
        << st.message();
  }
  ExpectUsable(3);
  // The same call with the same arguments everywhere: rank 0 gets the exact sum.
  st = shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32);
  EXPECT_TRUE(OkOnEveryRank(st));
  if (rank() == 0) {
    EXPECT_EQ(out[2], static_cast<float>(size()));
  }
  ExpectUsable(4);
}

// The ranks that return early settle each call by the first summing rank's confirmation: calls
// that agree, confirmed one after another (rank 1 sums, so rank 0 is one that returns early),
// must not let a later disagreement pass for one of them.
TEST_F(ShmAgreement, ReduceScatterWithNothingToReceiveAfterAgreedCalls) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const bool early = EmptyRanksReturnEarly();
  std::vector<size_t> counts(static_cast<size_t>(size()), 0);
  counts[1] = 2;
  std::vector<float> in(2), out(2, 0.0f);
  for (int call = 0; call < 5; ++call) {
    in.assign(2, static_cast<float>(rank() + call));
    Status st = shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32);
    ASSERT_TRUE(OkOnEveryRank(st)) << st.ToString();
    if (rank() == 1) {
      // sum over ranks of (rank + call)
      const float expected = static_cast<float>(size() * (size() - 1) / 2 + size() * call);
      EXPECT_EQ(out[0], expected);
      EXPECT_EQ(out[1], expected);
    }
  }
  // Rank 0 alone (it returns early) calls with another dtype.
  Status st = shm_->ReduceScatter(in.data(), out.data(), counts,
                                  rank() == 0 ? DType::kInt32 : DType::kFloat32);
  if (early) {
    EXPECT_TRUE(OnEveryRank(rank() != 1 ? st.ok() : st.code() == StatusCode::kMismatch))
        << st.ToString();
    ExpectFailureCarriedToTheNextCall("dtype differs across ranks", "ReduceScatter", 1, 0);
  } else {
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  }
  ExpectUsable(3);
  in.assign(2, 1.0f);
  st = shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32);
  EXPECT_TRUE(OkOnEveryRank(st)) << st.ToString();
  if (rank() == 1) {
    EXPECT_EQ(out[1], static_cast<float>(size()));
  }
  ExpectUsable(4);
}

TEST_F(ShmAgreement, LayoutOrDTypeDiffersOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const size_t p = static_cast<size_t>(size());
  // Same total, different split.
  std::vector<size_t> counts = ShardCounts(10 * p, size());
  if (odd()) {
    counts[0] += 1;
    counts[p - 1] -= 1;
  }
  std::vector<float> in(10 * p, 1.0f), out(10 * p);
  Status st = shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find("counts vector (shard layout) differs"), std::string::npos)
      << st.message();
  ExpectUsable(1);
  std::vector<double> d(16, 1.0);
  st = shm_->AllReduce(d.data(), d.data(), 8, odd() ? DType::kInt64 : DType::kFloat64);
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find("dtype differs across ranks"), std::string::npos) << st.message();
  ExpectUsable(50000);
}

// An allreduce, reduce-scatter or allgather of one step checks its peers by their stamps
// (EnterStamped): a peer's call passes on its stamp's digest alone, and the smallest carry their
// data on the stamp's line. One rank's dtype of the same width (float32 / int32: the same bytes
// move, only the digest differs), and one rank that refuses the call (it takes Enter, which
// stamps nothing), must fail every rank in the call, with data beside the stamp (1 element) or
// in the slot (100); between them, agreed calls of 1-12 and 100 elements per rank, in sequence
// with broadcasts from rotating roots that stamp the same heads, give exact values.
TEST_F(ShmAgreement, CallsOnTheStampLine) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const size_t p = static_cast<size_t>(size());
  const DType theirs = odd() ? DType::kInt32 : DType::kFloat32;
  std::vector<float> in(100 * p, 1.0f), out(100 * p, 0.0f);
  const CollectiveArgs refused{"AllReduce", -1, 0, -1, 0,
                               InvalidArgument("allreduce_: tensor 3 is not contiguous")};
  for (size_t n : {size_t{1}, size_t{100}}) {
    for (int kind = 0; kind < 3; ++kind) {
      auto call = [&](DType dtype) {
        std::vector<size_t> c(p, n);
        if (kind == 0) return shm_->AllReduce(in.data(), out.data(), n, dtype);
        if (kind == 1) return shm_->ReduceScatter(in.data(), out.data(), c, dtype);
        return shm_->AllGather(in.data(), out.data(), n, dtype);
      };
      Status st = call(theirs);
      EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch))
          << n << " " << kind << ": " << st.ToString();
      EXPECT_NE(st.message().find("dtype differs across ranks"), std::string::npos)
          << st.message();
      ExpectUsable(3);
      st = odd() ? shm_->Agree(refused) : call(DType::kFloat32);
      EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument))
          << n << " " << kind << ": " << st.ToString();
      EXPECT_NE(st.message().find("tensor 3 is not contiguous"), std::string::npos)
          << st.message();
      ExpectUsable(5);
    }
  }
  for (size_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 100}) {
    const int root = static_cast<int>(n % p);
    std::vector<float> b(n, rank() == root ? static_cast<float>(n) : -1.0f);
    ASSERT_TRUE(OkOnEveryRank(shm_->Broadcast(b.data(), n, DType::kFloat32, root)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(b[i]); },
                         [&](size_t) { return static_cast<double>(n); }));
    // Rank r's element i: 1000 r + 10 n + i (exact in float32), so a value from another rank,
    // call or place shows.
    for (size_t i = 0; i < n * p; ++i) {
      in[i] = static_cast<float>(1000 * rank() + 10 * static_cast<int>(n) + static_cast<int>(i));
    }
    const double ranks_sum = 1000.0 * static_cast<double>(p * (p - 1) / 2);
    auto summed = [&](size_t i) { return ranks_sum + static_cast<double>(p * (10 * n + i)); };
    ASSERT_TRUE(OkOnEveryRank(shm_->AllReduce(in.data(), out.data(), n, DType::kFloat32)));
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(out[i]); }, summed));
    // n elements per rank: rank r gets elements [r n, (r + 1) n) summed.
    const std::vector<size_t> counts(p, n);
    ASSERT_TRUE(OkOnEveryRank(shm_->ReduceScatter(in.data(), out.data(), counts, DType::kFloat32)));
    const size_t first = static_cast<size_t>(rank()) * n;
    EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(out[i]); },
                         [&](size_t i) { return summed(first + i); }));
    ASSERT_TRUE(OkOnEveryRank(shm_->AllGather(in.data(), out.data(), n, DType::kFloat32)));
    EXPECT_TRUE(AllEqual(n * p, [&](size_t i) { return static_cast<double>(out[i]); },
                         [&](size_t i) { return 1000.0 * static_cast<double>(i / n) +
                                                static_cast<double>(10 * n + i % n); }));
  }
  ExpectUsable(7);
}

// ---- Broadcasts laid across every rank's slot ("Broadcast across the slots"). ----
// The 1 MiB stage: with more than two ranks per core (P = 5-9 on 2 cores), broadcasts of
// 512 KiB-P MiB take one piece across the slots; elsewhere they go in pieces and these tests
// check that way instead (the mismatch tests skip).
class ShmAcross : public ShmAgreement {
 protected:
  void SetUp() override {
    auto s = ShmCollectives::Create(World()->mpi_comm(), size_t{1} << 20, 60.0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shm_ = std::move(s).value();
  }
  // Floats in the largest broadcast across the slots (0 where there is none).
  size_t across() const { return shm_->across_bytes() / sizeof(float); }
};

// Broadcasts just above one piece, of every slot, and one float more (in pieces), from roots
// that rotate, between allreduces and allgathers that fill every rank's slots of the same
// stages. Nothing synchronizes the ranks between calls: a fast rank's next call writes its own
// slot while slow ones may still read the last broadcast.
TEST_F(ShmAcross, BroadcastsBetweenOtherCallsKeepStagesApart) {
  const int p = size();
  const size_t slots = static_cast<size_t>(p) << 18;  // P MiB of floats
  for (int round = 0; round < 3; ++round) {
    for (size_t n : {(size_t{1} << 17) + 1, slots, slots + 1, size_t{3} << 18}) {
      SCOPED_TRACE(StrCat("round ", round, ", n=", n, ", across up to ", across()));
      const int root = (round + static_cast<int>(n % 7)) % p;
      std::vector<float> b(n, -1.0f);
      if (rank() == root) {
        for (size_t i = 0; i < n; ++i) b[i] = static_cast<float>((root + 2) * F(i + round));
      }
      Status st = shm_->Broadcast(b.data(), n, DType::kFloat32, root);
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(AllEqual(n, [&](size_t i) { return static_cast<double>(b[i]); },
                           [&](size_t i) { return (root + 2) * F(i + round); }))
          << "root " << root;
      const size_t m = (size_t{3} << 17) + 7;  // 1.5 MiB: four chunks of the allreduce
      std::vector<float> x(m), y(m);
      for (size_t i = 0; i < m; ++i) x[i] = static_cast<float>((rank() + 1) * F(i + round));
      st = shm_->AllReduce(x.data(), y.data(), m, DType::kFloat32);
      EXPECT_TRUE(st.ok()) << st.ToString();
      const double tri = p * (p + 1) / 2.0;
      EXPECT_TRUE(AllEqual(m, [&](size_t i) { return static_cast<double>(y[i]); },
                           [&](size_t i) { return tri * F(i + round); }));
      const size_t g = size_t{1} << 16;
      std::vector<float> mine(g, static_cast<float>(rank() + round)), all(g * p);
      st = shm_->AllGather(mine.data(), all.data(), g, DType::kFloat32);
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(AllEqual(g * p, [&](size_t i) { return static_cast<double>(all[i]); },
                           [&](size_t i) { return static_cast<double>(i / g + round); }));
    }
  }
}

// One receiver's count puts it on the other way: in pieces where the root lays its buffer
// across the slots (the root and the receivers that agree return OK, the next call fails on
// every rank), then across the slots where the others go in pieces (every rank fails in the
// call). The window stays in step after both.
TEST_F(ShmAcross, CountDiffersOnOneReceiverOnEitherWay) {
  if (size() < 3) GTEST_SKIP() << "needs a root and two receivers";
  if (across() == 0) {
    GTEST_SKIP() << "broadcasts go across the slots only with more than two ranks per core";
  }
  const size_t n = across();
  {
    const size_t mine = odd() ? n + 1 : n;
    std::vector<float> b(n + 1, rank() == 0 ? 3.0f : -1.0f);
    Status st = shm_->Broadcast(b.data(), mine, DType::kFloat32, 0);
    EXPECT_TRUE(OnEveryRank(odd() ? st.code() == StatusCode::kMismatch : st.ok()))
        << st.ToString();
    if (!odd()) {
      EXPECT_EQ(b[n - 1], 3.0f);
    }
    ExpectFailureCarriedToTheNextCall("element count differs across ranks");
    ASSERT_NO_FATAL_FAILURE(ExpectUsable(1000));
  }
  {
    const size_t mine = odd() ? n : n + 1;
    std::vector<float> b(n + 1, rank() == 0 ? 4.0f : -1.0f);
    Status st = shm_->Broadcast(b.data(), mine, DType::kFloat32, 0);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find(StrCat("element count differs across ranks (",
                                       testing::OneOddGroups(size() - 1, std::to_string(n + 1),
                                                             std::to_string(n)),
                                       ")")),
              std::string::npos)
        << st.message();
    ASSERT_NO_FATAL_FAILURE(ExpectUsable(1000));
  }
}

// Through the backend (the default: every call on one node goes through the window): one
// rank's count differs at a size Open MPI would carry (threshold raised) and at one the window
// carries; both fail on every rank with the counts named.
TEST(ShmBackendAgreement, MismatchWithTheDataOnEitherPath) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Backend& be = World()->host_backend();
  const bool odd = World()->rank() == World()->size() - 1;
  for (const char* threshold : {"1", "1000000"}) {
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", threshold).ok());
    std::vector<float> x(40, 2.0f);
    Status st = be.AllReduce(x.data(), x.data(), odd ? 33 : 32, DType::kFloat32);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find("element count differs across ranks (" +
                                testing::OneOddGroups(World()->size() - 1, "32", "33") + ")"),
              std::string::npos)
        << st.message();
    st = be.AllReduce(x.data(), x.data(), 32, DType::kFloat32);
    EXPECT_TRUE(OkOnEveryRank(st));
    EXPECT_EQ(x[0], 2.0f * static_cast<float>(World()->size()));
  }
  Settings::Global().Reset();
}

// A shared-memory setting changed on one rank only, after the window exists: the window's
// threshold raised there (it would send the data through Open MPI while its peers use the
// window), the window turned off there (the same), or its stage size changed (it would free and
// rebuild the window, MPI calls its peers never make). Every rank fails each call with the
// settings named, within the call or, for a broadcast's root that returned early, the next one;
// nobody waits for the timeout. Once the rank goes back to its peers' settings, calls work again.
TEST(ShmBackendAgreement, SettingsChangedOnOneRankFailEveryRank) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Backend& be = World()->host_backend();
  const int p = World()->size();
  const bool odd = World()->rank() == p - 1;
  const std::pair<const char*, const char*> changes[] = {
      {"POSEIDON_SHM_THRESHOLD_BYTES", "1000000000"},
      {"POSEIDON_SHM_THRESHOLD_BYTES", "0"},
      {"POSEIDON_SHM_CHUNK_BYTES", "16384"},
  };
  const std::string named = "the ranks' shared-memory settings differ";
  std::vector<float> x(8 * static_cast<size_t>(p), 2.0f), y(x.size());
  for (const auto& [name, value] : changes) {
    SCOPED_TRACE(StrCat(name, "=", value, " on rank ", p - 1));
    Settings::Global().Reset();
    ASSERT_TRUE(OkOnEveryRank(be.AllReduce(x.data(), y.data(), 8, DType::kFloat32)));
    if (odd) {
      ASSERT_TRUE(Settings::Global().Set(name, value).ok());
    }
    Status st = be.AllReduce(x.data(), y.data(), 8, DType::kFloat32);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find(named), std::string::npos) << st.message();
    st = be.AllGather(x.data(), y.data(), 8, DType::kFloat32);
    EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
    EXPECT_NE(st.message().find(named), std::string::npos) << st.message();
    st = be.Broadcast(x.data(), 8, DType::kFloat32, 0);
    if (odd) Settings::Global().Reset();
    Status next = be.Barrier();
    const Status& seen = st.ok() ? next : st;
    EXPECT_TRUE(OnEveryRank(seen.code() == StatusCode::kMismatch)) << seen.ToString();
    EXPECT_NE(seen.message().find(named), std::string::npos) << seen.message();
    ASSERT_TRUE(OkOnEveryRank(be.AllReduce(x.data(), y.data(), 8, DType::kFloat32)));
    EXPECT_EQ(y[7], 2.0f * static_cast<float>(p));
  }
  Settings::Global().Reset();
}

// A sink on the committed first piece (on one rank only) fails the call on every rank, naming
// it; the pieces keep their inputs and the backend stays usable.
TEST(ShmBackendAgreement, SinkOnTheFirstPieceIsRefusedEverywhere) {
  Backend& be = World()->host_backend();
  const bool odd = World()->rank() == World()->size() - 1;
  std::vector<float> head(4, 1.0f), head_sum(4), body(100, 3.0f);
  const SumSink sink = [](size_t, size_t, const void*) {};
  std::vector<SumPiece> pieces = {{head.data(), head_sum.data(), head.size(), odd ? &sink : nullptr},
                                  {body.data(), body.data(), body.size()}};
  bool committed = true;
  Status st = be.AllReducePieces(pieces, DType::kFloat32, {}, nullptr, &committed);
  if (st.code() == StatusCode::kUnimplemented) GTEST_SKIP() << "no window here: " << st.message();
  EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kInvalidArgument)) << st.ToString();
  EXPECT_NE(st.message().find("the first piece has a sink"), std::string::npos) << st.message();
  EXPECT_EQ(body[0], 3.0f);
  pieces[0].sink = nullptr;
  EXPECT_TRUE(OkOnEveryRank(be.AllReducePieces(pieces, DType::kFloat32, {}, nullptr, &committed)));
  EXPECT_TRUE(committed);
  EXPECT_EQ(body[99], 3.0f * static_cast<float>(World()->size()));
}

// The caller's terms of a call (CallOptions::detail: an op a binding applies to the sum, say)
// that differ on one rank fail the call on every rank with each rank's text, on every path
// (no window: AgreeOnArgs's exchange; the window's agreement with Open MPI carrying the data,
// threshold raised, or the window carrying it); a detail on one rank and none
// elsewhere differs too, and a text that differs past the part shown is still caught.
TEST(ShmBackendAgreement, DetailDiffersOnOneRankOnEveryPath) {
  if (World()->size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Backend& be = World()->host_backend();
  const int p = World()->size();
  const bool odd = World()->rank() == p - 1;
  const std::string long_text(300, 'x');
  struct Case {
    std::optional<std::string> mine, theirs;  // the detail of ranks 0..p-2, of the last rank
    std::string shown;                        // in the message
  };
  const std::vector<Case> cases = {
      {"op average", "op sum", testing::OneOddGroups(p - 1, "op average", "op sum")},
      {std::nullopt, "op sum", testing::OneOddGroups(p - 1, "(none)", "op sum")},
      {long_text, long_text + "y", "differing past the part shown"},
  };
  for (const char* threshold : {"0", "1", "1000000"}) {
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_SHM_THRESHOLD_BYTES", threshold).ok());
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::optional<std::string>& detail = odd ? cases[c].theirs : cases[c].mine;
      CallOptions opts;
      opts.detail = detail ? detail->c_str() : nullptr;
      std::vector<float> x(8 * static_cast<size_t>(p), 2.0f), y(x.size());
      Status st = be.AllReduce(x.data(), x.data(), 8, DType::kFloat32, opts);
      EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << threshold << " " << c
                                                                   << ": " << st.ToString();
      EXPECT_NE(st.message().find("AllReduce: the caller's terms of the call differ across "
                                  "ranks"),
                std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(cases[c].shown), std::string::npos) << st.message();
      EXPECT_EQ(x[0], 2.0f) << "the mismatched call changed its buffer";
      st = be.AllGather(x.data(), y.data(), 8, DType::kFloat32, opts);
      EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
      st = be.ReduceScatter(x.data(), y.data(), ShardCounts(8 * static_cast<size_t>(p), p),
                            DType::kFloat32, opts);
      EXPECT_TRUE(OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
      // The same terms on every rank pass, and the backend is usable.
      opts.detail = "op sum";
      EXPECT_TRUE(OkOnEveryRank(be.AllReduce(x.data(), x.data(), 8, DType::kFloat32, opts)));
      EXPECT_EQ(x[7], 2.0f * static_cast<float>(p));
    }
  }
  Settings::Global().Reset();
}

}  // namespace
}  // namespace poseidon
