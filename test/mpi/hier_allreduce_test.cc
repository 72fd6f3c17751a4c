// Multi-rank tests of the two-level allreduce (runtime/hier_allreduce.h). One machine has one
// node, so the tests give each rank the node it counts as on (HierAllReduce::Create's `node`):
// every split of the world into equal nodes of more than one rank, with consecutive ranks on a
// node and with ranks dealt round-robin; uneven splits, one node and one rank per node must be
// refused on every rank. Exact integer sums in every dtype taken, every rank the same bits.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/hier_allreduce.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"
#include "runtime/shm_collectives.h"
#include "test/mpi/rank_checks.h"
#include "test/mpi/shm_test_util.h"
#include "test/mpi/typed_buffer.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::AllEqual;
using testing::Exact;
using testing::F;
using testing::OkOnEveryRank;
using testing::SameOnEveryRank;
using testing::World;
using Buf = testing::TypedBuffer;

constexpr size_t kChunk = 8192;  // small: the window's pipeline runs many rounds
constexpr double kTimeoutS = 30;

int Rank() { return World()->rank(); }
int Size() { return World()->size(); }

struct Split {
  std::string name;
  int per_node = 0;  // ranks per node
  bool round_robin = false;
  int NodeOf(int rank, int world) const {
    const int nodes = world / per_node;
    return round_robin ? rank % nodes : rank / per_node;
  }
};

// Every split into equal nodes of 2..P/2 ranks, both placements.
std::vector<Split> EvenSplits(int world) {
  std::vector<Split> out;
  for (int l = 2; l < world; ++l) {
    if (world % l != 0) continue;
    for (bool rr : {false, true}) {
      out.push_back({std::to_string(world / l) + " nodes x " + std::to_string(l) +
                         (rr ? " ranks, round-robin" : " ranks, consecutive"),
                     l, rr});
    }
  }
  return out;
}

// Every split paired with every single-copy setting.
std::vector<std::pair<Split, size_t>> Splits(const std::vector<Split>& splits,
                                             const std::vector<size_t>& single_copy) {
  std::vector<std::pair<Split, size_t>> out;
  for (const Split& s : splits) {
    for (size_t b : single_copy) out.emplace_back(s, b);
  }
  return out;
}

// single_copy_bytes: the node window's (0: its gathers go through the window).
Result<std::unique_ptr<HierAllReduce>> CreateWithNode(int node, size_t single_copy_bytes = 0) {
  return HierAllReduce::Create(World()->mpi_comm(), kChunk, kTimeoutS, node, single_copy_bytes);
}

// The status is the same kUnavailable on every rank.
void ExpectUnavailableEverywhere(int node, const std::string& what) {
  auto h = CreateWithNode(node);
  const bool unavailable = !h.ok() && h.status().code() == StatusCode::kUnavailable;
  EXPECT_TRUE(testing::OnEveryRank(unavailable))
      << what << ": " << (h.ok() ? std::string("created") : h.status().ToString());
}

TEST(HierAllReduce, RefusesOneNodeOneRankPerNodeAndUnevenNodes) {
  ExpectUnavailableEverywhere(0, "one node");
  ExpectUnavailableEverywhere(Rank(), "one rank per node");
  if (Size() >= 3) {
    // The last rank alone, the others on one node: uneven at every P >= 3.
    ExpectUnavailableEverywhere(Rank() == Size() - 1 ? 1 : 0, "nodes of P-1 and 1 ranks");
  }
}

TEST(HierAllReduce, ExactSumsOnEveryEvenSplit) {
  const std::vector<Split> splits = EvenSplits(Size());
  if (splits.empty()) {
    GTEST_SKIP() << "P = " << Size() << " has no split into equal nodes of 2..P/2 ranks";
  }
  const double tri = Size() * (Size() + 1) / 2.0;
  // Each split with the node window's gathers through its slots, read straight from the node
  // peers' memory from 4 KiB of the gathered buffer (ShmCollectives' single copy), and chosen
  // as the backend's default chooses (where a node's ranks have a core each, every node times
  // both ways in its own window, all at once; where they outnumber the cores, the window).
  constexpr size_t kAuto = ShmCollectives::kSingleCopyAuto;
  for (const auto& [split, single] : Splits(splits, {0, 4096, kAuto})) {
    SCOPED_TRACE(split.name + (single == 0       ? ", through the window"
                               : single == kAuto ? ", single copy chosen by timing"
                                                 : ", single copy from 4 KiB"));
    auto h = CreateWithNode(split.NodeOf(Rank(), Size()), single);
    ASSERT_TRUE(OkOnEveryRank(h.status()));
    const ShmCollectives& window = (*h)->node_window();
    if (single == 4096) {
      // On, unless the kernel refuses the reads here (the note says why).
      EXPECT_TRUE(window.single_copy_bytes() == 4096 || !window.single_copy_note().empty())
          << window.single_copy_bytes();
    } else if (single == 0) {
      EXPECT_EQ(window.single_copy_bytes(), 0u);
    }
    EXPECT_EQ((*h)->nodes(), Size() / split.per_node);
    EXPECT_EQ((*h)->local_size(), split.per_node);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      ASSERT_TRUE(HierAllReduce::Takes(dt));
      for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{3 * kChunk + 1}, size_t{100003}}) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                       (in_place ? " in place" : " out of place"));
          Buf send(dt, n), recv(dt, n);
          for (size_t i = 0; i < n; ++i) send.Set(i, (Rank() + 1) * F(i));
          void* out = in_place ? send.data() : recv.data();
          ASSERT_TRUE(OkOnEveryRank((*h)->AllReduce(send.data(), out, n, dt, MpiWait{})));
          const Buf& got = in_place ? send : recv;
          EXPECT_TRUE(AllEqual(n, [&](size_t i) { return got.Get(i); },
                               [&](size_t i) { return Exact(dt, tri * F(i)); }));
          EXPECT_TRUE(SameOnEveryRank(out, got.used(n)));
        }
      }
    }
    EXPECT_FALSE((*h)->broken());
  }
}

// One rank with its own window setting: every rank fails Create with kMismatch naming it,
// whichever node that rank is on (a node's window checks only its own ranks), and none waits
// for another. Then the same creation with the settings alike works.
TEST(HierAllReduce, WindowSettingOnOneRankFailsEveryRank) {
  const std::vector<Split> splits = EvenSplits(Size());
  if (splits.empty()) {
    GTEST_SKIP() << "P = " << Size() << " has no split into equal nodes of 2..P/2 ranks";
  }
  const Split& split = splits.front();
  const int node = split.NodeOf(Rank(), Size());
  const bool odd = Rank() == Size() - 1;
  struct Case {
    const char* knob;
    size_t chunk, single;
  };
  for (const Case& c : {Case{"POSEIDON_SHM_CHUNK_BYTES", odd ? 2 * kChunk : kChunk, 0},
                        Case{"POSEIDON_SHM_SINGLE_COPY_BYTES", kChunk, odd ? size_t{4096} : 0},
                        Case{"POSEIDON_SHM_SINGLE_COPY_BYTES", kChunk,
                             odd ? ShmCollectives::kSingleCopyAuto : 0}}) {
    SCOPED_TRACE(std::string(c.knob) + " on rank " + std::to_string(Size() - 1));
    auto h = HierAllReduce::Create(World()->mpi_comm(), c.chunk, kTimeoutS, node, c.single);
    const bool mismatch = !h.ok() && h.status().code() == StatusCode::kMismatch &&
                          h.status().message().find(c.knob) != std::string::npos;
    EXPECT_TRUE(testing::OnEveryRank(mismatch))
        << (h.ok() ? std::string("created") : h.status().ToString());
  }
  auto h = CreateWithNode(node);
  ASSERT_TRUE(OkOnEveryRank(h.status()));
  std::vector<int32_t> x(1000, Rank() + 1), y(1000);
  ASSERT_TRUE(OkOnEveryRank((*h)->AllReduce(x.data(), y.data(), x.size(), DType::kInt32, {})));
  EXPECT_TRUE(testing::OnEveryRank(y[999] == Size() * (Size() + 1) / 2));
}

// Polled under an interrupt that never fires: the non-blocking cross-node form.
class NeverFires : public Interrupt {
 public:
  Status Check() const override { return Status::Ok(); }
};

TEST(HierAllReduce, UnderAnInterruptAndAfterManyCalls) {
  const std::vector<Split> splits = EvenSplits(Size());
  if (splits.empty()) {
    GTEST_SKIP() << "P = " << Size() << " has no split into equal nodes of 2..P/2 ranks";
  }
  const Split& split = splits.back();
  auto h = CreateWithNode(split.NodeOf(Rank(), Size()));
  ASSERT_TRUE(OkOnEveryRank(h.status()));
  NeverFires never;
  const MpiWait how{&never, "HierAllReduceTest", nullptr};
  // Sizes that change from call to call: the shard buffer grows and is reused.
  for (int call = 0; call < 12; ++call) {
    const size_t n = (call % 4 == 3) ? 70001 : static_cast<size_t>(call) * 997 + 3;
    std::vector<int32_t> send(n), recv(n, -1);
    for (size_t i = 0; i < n; ++i) send[i] = (Rank() + 1) * static_cast<int32_t>(i % 11 + call);
    ASSERT_TRUE(OkOnEveryRank((*h)->AllReduce(send.data(), recv.data(), n, DType::kInt32, how)))
        << "call " << call;
    const int32_t tri = Size() * (Size() + 1) / 2;
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += recv[i] != tri * static_cast<int32_t>(i % 11 + call);
    EXPECT_EQ(bad, 0u) << "call " << call << " n=" << n;
  }
}

TEST(HierAllReduce, HalfTypesAreNotTaken) {
  EXPECT_FALSE(HierAllReduce::Takes(DType::kFloat16));
  EXPECT_FALSE(HierAllReduce::Takes(DType::kBFloat16));
}

// On one machine the backend never goes two-level: every allreduce stays on the window.
TEST(HierAllReduce, BackendOnOneNodeHasNoHierarchy) {
  MpiBackend backend(World()->mpi_comm());
  Result<bool> has = backend.HasHierarchy();
  ASSERT_TRUE(OkOnEveryRank(has.status()));
  EXPECT_FALSE(*has);
}

}  // namespace
}  // namespace poseidon
